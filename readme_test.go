package idempotency_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/internal/doctest"
	"github.com/go-idempotency/idempotency/internal/pgtest"
)

// TestReadmeSnippetsCompile compiles the Go of this module's Markdown
// files (README.md, client/, pgstore/, redisstore/...): every program, and
// every fragment with the declarations it assumes (see package doctest),
// so that the documentation cannot drift from the API.
func TestReadmeSnippetsCompile(t *testing.T) {
	doctest.CheckGo(t)
}

// TestEveryModuleChecksItsMarkdown checks that every module of the
// repository whose Markdown files hold Go compiles them in its tests
// (doctest.CheckGo), so that a module tested alone (./scripts/test grpc)
// finds its README broken.
func TestEveryModuleChecksItsMarkdown(t *testing.T) {
	repo := doctest.Repository(t)
	checked := 0
	for _, m := range repo.Modules {
		var withGo []string
		for _, md := range doctest.MarkdownFiles(t, m.Dir) {
			if doctest.HasGo(t, md) {
				withGo = append(withGo, md)
			}
		}
		if len(withGo) == 0 {
			continue
		}
		tests, _ := filepath.Glob(filepath.Join(m.Dir, "*_test.go"))
		calls := false
		for _, f := range tests {
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			calls = calls || bytes.Contains(src, []byte("doctest.CheckGo(t)"))
		}
		if !calls {
			t.Errorf("module %s: no test of its root package calls doctest.CheckGo(t), and these hold Go: %v", m.Module.Path, withGo)
		}
		checked++
	}
	if checked < 6 {
		t.Errorf("%d modules hold Go in their Markdown files, want at least the root, the adapters, the brokers and grpc", checked)
	}
}

// TestReadmeOutboxSnippetRuns runs the README's outbox program as a new
// user would, on a database of its own and a nats-server -js of the
// test's own, with nothing created beforehand: the program creates its
// tables and its stream, checks the stream's duplicate window against
// the relay's, answers the first POST with the first payment, replays it
// to the duplicate, and its relay publishes the message (the outbox row is
// done, which the relay marks only once the stream acknowledged it).
func TestReadmeOutboxSnippetRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a program with the go command, PostgreSQL and nats-server")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go command not found: the README's program is built with it")
	}
	natsURL := startNATS(t)
	dbURL := pgtest.Database(t)
	text, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var src []byte
	for _, m := range regexp.MustCompile("(?s)```go\n(package main\n.*?)```").FindAllSubmatch(text, -1) {
		if bytes.Contains(m[1], []byte(`"github.com/go-idempotency/idempotency/outbox/relay"`)) {
			src = m[1]
		}
	}
	if src == nil {
		t.Fatal("no program with the relay in README.md")
	}
	dir := doctest.Module(t, map[string][]byte{"outbox/main.go": src})
	bin := filepath.Join(dir, "outbox-program")
	build := exec.Command(goBin, "build", "-mod=mod", "-o", bin, "./outbox")
	build.Dir, build.Env = dir, append(os.Environ(), "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the README's outbox program: %v\n%s", err, out)
	}

	addr := freeAddr(t)
	var out lockedBuffer
	prog := exec.Command(bin)
	prog.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "NATS_URL="+natsURL, "ADDR="+addr)
	prog.Stdout, prog.Stderr = &out, &out
	exited := startProcess(t, prog)
	waitListening(t, addr, exited, &out)

	post := func() (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/", nil)
		req.Header.Set("Idempotency-Key", "order-1")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("POST: %v\nthe program's output:\n%s", err, out.String())
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return res, string(body)
	}
	if res, body := post(); res.StatusCode != http.StatusCreated || body != `{"payment":1}` {
		t.Fatalf("first POST: %d %q, want 201 {\"payment\":1}\nthe program's output:\n%s", res.StatusCode, body, out.String())
	}
	if res, body := post(); res.StatusCode != http.StatusCreated || body != `{"payment":1}` || res.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("duplicate POST: %d %q %v, want the first answer replayed", res.StatusCode, body, res.Header)
	}

	pool := pgtest.PoolOn(t, dbURL)
	var status, lastError string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) { // the relay's mark has no signal the test can wait on
		err := pool.QueryRow(context.Background(), `SELECT status, coalesce(last_error, '') FROM idempotency_outbox`).Scan(&status, &lastError)
		if err != nil {
			t.Fatal(err)
		}
		if status == "done" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the message is %s after 30s (last error %q)\nthe program's output:\n%s", status, lastError, out.String())
		}
	}
}

// startNATS starts a nats-server -js on a free loopback port until t
// ends, and returns its URL. Without nats-server t is skipped, or failed
// under IDEMPOTENCY_REQUIRE_NATS=1.
func startNATS(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		bin = "/usr/sbin/nats-server" // Debian's package
	}
	if _, err := os.Stat(bin); err != nil {
		msg := "nats-server not found (Debian's nats-server package)"
		if os.Getenv("IDEMPOTENCY_REQUIRE_NATS") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	addr := freeAddr(t)
	host, port, _ := net.SplitHostPort(addr)
	dir := t.TempDir()
	var out lockedBuffer
	cmd := exec.Command(bin, "-js", "-a", host, "-p", port, "-sd", filepath.Join(dir, "jetstream"))
	cmd.Stdout, cmd.Stderr = &out, &out
	exited := startProcess(t, cmd)
	waitListening(t, addr, exited, &out)
	return "nats://" + addr
}

// freeAddr returns a free address on the loopback interface.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startProcess starts cmd and stops it by its PID when t ends (SIGTERM,
// then SIGKILL after 5s); the channel returned is closed when it exits.
func startProcess(t *testing.T, cmd *exec.Cmd) <-chan struct{} {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	return exited
}

// waitListening waits up to 30s for addr to accept connections, failing t
// when the process that should listen there exits first.
func waitListening(t *testing.T, addr string, exited <-chan struct{}, out *lockedBuffer) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return
		}
		select {
		case <-exited:
			t.Fatalf("exited before listening on %s:\n%s", addr, out.String())
		case <-time.After(20 * time.Millisecond): // a listener has no signal to wait on
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on %s after 30s:\n%s", addr, out.String())
		}
	}
}

// lockedBuffer is a bytes.Buffer that a process writes while a test reads.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
