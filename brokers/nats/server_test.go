package idemnats_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Environment of the tests.
const (
	// urlEnv names a running server to use (with JetStream) instead of
	// starting one.
	urlEnv = "NATS_URL"
	// requireEnv, set to 1 (as CI sets it), fails the tests that need a
	// server when nats-server is not installed, instead of skipping them.
	requireEnv = "IDEMPOTENCY_REQUIRE_NATS"
)

// natsURL returns the URL of a JetStream server for t: NATS_URL, or a
// private nats-server started for t and stopped when t ends.
func natsURL(t testing.TB) string {
	t.Helper()
	if u := os.Getenv(urlEnv); u != "" {
		return u
	}
	return startServer(t).url
}

// server is a nats-server process owned by a test.
type server struct {
	url    string
	cmd    *exec.Cmd
	exited chan struct{}
}

// serverBinary returns the path of nats-server: on PATH, or where Debian's
// package puts it.
func serverBinary() (string, error) {
	if p, err := exec.LookPath("nats-server"); err == nil {
		return p, nil
	}
	const debian = "/usr/sbin/nats-server"
	if _, err := os.Stat(debian); err != nil {
		return "", errors.New("nats-server not found on PATH nor at " + debian)
	}
	return debian, nil
}

// startServer starts nats-server -js on a free loopback port, its store in
// a temporary directory, and returns once it accepts connections. Without
// nats-server t is skipped, or failed under IDEMPOTENCY_REQUIRE_NATS=1.
func startServer(t testing.TB) *server {
	t.Helper()
	bin, err := serverBinary()
	if err != nil {
		msg := err.Error() + ": install Debian's nats-server package, or set " + urlEnv
		if os.Getenv(requireEnv) == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	dir := t.TempDir()
	for attempt := 0; ; attempt++ {
		s, err := launch(bin, dir)
		if err == nil {
			t.Cleanup(s.stop)
			return s
		}
		if attempt == 4 {
			t.Fatalf("starting nats-server: %v", err)
		}
	}
}

func launch(bin, dir string) (*server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "nats-server.log")
	cmd := exec.Command(bin, "-js", "-a", "127.0.0.1", "-p", strconv.Itoa(port),
		"-sd", filepath.Join(dir, "jetstream"), "-l", logPath)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &server{url: "nats://127.0.0.1:" + strconv.Itoa(port), cmd: cmd, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.exited) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if nc, err := nats.Connect(s.url, nats.Timeout(time.Second)); err == nil {
			js, err := jetstream.New(nc)
			if err == nil {
				_, err = js.AccountInfo(context.Background())
			}
			nc.Close()
			if err == nil {
				return s, nil
			}
		}
		select {
		case <-s.exited:
			out, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("nats-server on port %d exited: %s", port, lastLines(string(out), 5))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("nats-server on port %d did not start within 10s", port)
		}
	}
}

// stop stops the server by its PID and waits for it to exit.
func (s *server) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// connect returns a JetStream context on a connection to url, closed when
// t ends.
func connect(t testing.TB, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, nats.Name(t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// stream is a stream of its own for a test, deleted when the test ends.
type stream struct {
	name, subject string
	js            jetstream.JetStream
}

// newStream creates a stream under a random name, with a subject of its
// own, deleted when t ends.
func newStream(t testing.TB, js jetstream.JetStream) *stream {
	t.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	id := hex.EncodeToString(b[:])
	s := &stream{name: "IDEMTEST_" + strings.ToUpper(id), subject: "idemtest." + id, js: js}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: s.name, Subjects: []string{s.subject}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), s.name) })
	return s
}

// consumer creates a durable pull consumer of the stream with explicit
// acks and the AckWait given.
func (s *stream) consumer(t testing.TB, name string, ackWait time.Duration) jetstream.Consumer {
	t.Helper()
	c, err := s.js.CreateOrUpdateConsumer(context.Background(), s.name, jetstream.ConsumerConfig{
		Durable:       name,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		MaxAckPending: 10_000,
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// publish publishes data with the headers given (name, value pairs) and
// waits for the stream's ack.
func (s *stream) publish(t testing.TB, data string, headers ...string) {
	t.Helper()
	m := nats.NewMsg(s.subject)
	m.Data = []byte(data)
	for i := 0; i+1 < len(headers); i += 2 {
		m.Header.Set(headers[i], headers[i+1])
	}
	if _, err := s.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}
