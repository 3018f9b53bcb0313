// Package natstest gives tests a NATS JetStream server: the one at
// NATS_URL, or a private nats-server -js started on a free loopback port,
// its store in a temporary directory, stopped by its PID when the test
// ends. Without nats-server a test is skipped with a message saying so,
// unless IDEMPOTENCY_REQUIRE_NATS=1 (as CI sets it), which fails it
// instead.
package natstest

import (
	"context"
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
	// URLEnv names a running server to use (with JetStream) instead of
	// starting one.
	URLEnv = "NATS_URL"
	// RequireEnv, set to 1 (as CI sets it), fails the tests that need a
	// server when nats-server is not installed, instead of skipping them.
	RequireEnv = "IDEMPOTENCY_REQUIRE_NATS"
)

// URL returns the URL of a JetStream server for t: NATS_URL, or a private
// nats-server started for t and stopped when t ends.
func URL(t testing.TB) string {
	t.Helper()
	if u := os.Getenv(URLEnv); u != "" {
		return u
	}
	return Start(t).URL
}

// Server is a nats-server process owned by a test.
type Server struct {
	// URL is the server's client URL, the same across Restart.
	URL string

	bin, dir string
	port     int
	cmd      *exec.Cmd
	exited   chan struct{}
}

// Binary returns the path of nats-server: on PATH, or where Debian's
// package puts it.
func Binary() (string, error) {
	if p, err := exec.LookPath("nats-server"); err == nil {
		return p, nil
	}
	const debian = "/usr/sbin/nats-server"
	if _, err := os.Stat(debian); err != nil {
		return "", errors.New("nats-server not found on PATH nor at " + debian)
	}
	return debian, nil
}

// Start starts nats-server -js on a free loopback port, its store in a
// temporary directory, and returns once it accepts connections and answers
// JetStream requests. The server is stopped when t ends. Without
// nats-server t is skipped, or failed under IDEMPOTENCY_REQUIRE_NATS=1.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		msg := err.Error() + ": install Debian's nats-server package, or set " + URLEnv
		if os.Getenv(RequireEnv) == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	s := &Server{bin: bin, dir: t.TempDir()}
	for attempt := 0; ; attempt++ {
		if s.port, err = freePort(); err == nil {
			s.URL = "nats://127.0.0.1:" + strconv.Itoa(s.port)
			if err = s.launch(); err == nil {
				t.Cleanup(s.Stop)
				return s
			}
		}
		if attempt == 4 {
			t.Fatalf("starting nats-server: %v", err)
		}
	}
}

// Restart starts the server again after Stop, on the same port with the
// same store, and returns once it answers.
func (s *Server) Restart() error {
	if err := s.launch(); err != nil {
		return fmt.Errorf("restarting nats-server: %w", err)
	}
	return nil
}

func (s *Server) launch() error {
	logPath := filepath.Join(s.dir, "nats-server.log")
	cmd := exec.Command(s.bin, "-js", "-a", "127.0.0.1", "-p", strconv.Itoa(s.port),
		"-sd", filepath.Join(s.dir, "jetstream"), "-l", logPath)
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	s.cmd, s.exited = cmd, exited
	go func() { _ = cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if nc, err := nats.Connect(s.URL, nats.Timeout(time.Second)); err == nil {
			js, err := jetstream.New(nc)
			if err == nil {
				_, err = js.AccountInfo(context.Background())
			}
			nc.Close()
			if err == nil {
				return nil
			}
		}
		select {
		case <-exited:
			out, _ := os.ReadFile(logPath)
			return fmt.Errorf("nats-server on port %d exited: %s", s.port, lastLines(string(out), 5))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.Stop()
			return fmt.Errorf("nats-server on port %d did not start within 10s", s.port)
		}
	}
}

// Stop stops the server by its PID (SIGTERM, SIGKILL after 5s) and waits
// for it to exit. It does nothing when the server is not running.
func (s *Server) Stop() {
	select {
	case <-s.exited:
		return
	default:
	}
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

// Connect returns a JetStream context on a connection to url, closed when
// t ends. opts are added to the connection's options.
func Connect(t testing.TB, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, append([]nats.Option{nats.Name(t.Name())}, opts...)...)
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
