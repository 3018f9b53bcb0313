package idempotency_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/internal/pgtest"
)

// TestReadmeSnippetsCompile builds every complete program (a ```go block that
// starts with "package main") in the README files, so the documentation
// cannot drift from the API. The programs are vetted in a module of their
// own in a temporary directory, which requires this one, and the modules
// of this repository that the programs import (brokers, adapters), through
// replace directives and starts from their go.sum files, so nothing is
// downloaded when the module cache holds their dependencies.
func TestReadmeSnippetsCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds programs with the go command")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go command not found: the README snippets are built with it")
	}
	root, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)```go\n(package main\n.*?)```")
	files, _ := filepath.Glob("*/README.md")
	files = append([]string{"README.md"}, files...)
	type snippet struct {
		file string
		n    int
		src  []byte
	}
	var snippets []snippet
	for _, f := range files {
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range block.FindAllSubmatch(text, -1) {
			snippets = append(snippets, snippet{f, i + 1, m[1]})
		}
	}
	if len(snippets) < 2 {
		t.Fatalf("found %d snippets, want at least the two quick starts", len(snippets))
	}
	var all []byte
	for _, s := range snippets {
		all = append(all, s.src...)
	}
	dir := snippetModule(t, root, all)
	for i, s := range snippets {
		pkg := fmt.Sprintf("snippet%d", i+1)
		if err := os.Mkdir(filepath.Join(dir, pkg), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, pkg, "main.go"), s.src, 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(goBin, "vet", "-mod=mod", "./"+pkg)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s snippet %d does not compile:\n%s\n%s", s.file, s.n, out, s.src)
		}
	}
}

// snippetModule makes a module in a temporary directory that requires this
// module and every module of the repository that src imports a package
// of, each replaced by its directory, with the highest go version of
// theirs and their go.sum files, and returns the directory.
func snippetModule(t *testing.T, root string, src []byte) string {
	t.Helper()
	const library = "github.com/go-idempotency/idempotency"
	dirs := []string{root}
	mods, _ := filepath.Glob(filepath.Join(root, "*", "*", "go.mod"))
	more, _ := filepath.Glob(filepath.Join(root, "*", "go.mod"))
	for _, m := range append(more, mods...) {
		sub, _ := filepath.Rel(root, filepath.Dir(m))
		path := library + "/" + filepath.ToSlash(sub)
		// The module's root package, or one of its packages.
		if bytes.Contains(src, []byte(`"`+path+`"`)) || bytes.Contains(src, []byte(`"`+path+`/`)) {
			dirs = append(dirs, filepath.Dir(m))
		}
	}
	goLine := regexp.MustCompile(`(?m)^go (\S+)`)
	var version string
	var requires, replaces, sums []byte
	for _, d := range dirs {
		gomod, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		v := goLine.FindSubmatch(gomod)
		if v == nil {
			t.Fatalf("no go line in %s", filepath.Join(d, "go.mod"))
		}
		if version == "" || newer(string(v[1]), version) {
			version = string(v[1])
		}
		path := library
		if sub, _ := filepath.Rel(root, d); sub != "." {
			path += "/" + filepath.ToSlash(sub)
		}
		requires = fmt.Appendf(requires, "require %s v0.0.0\n", path)
		replaces = fmt.Appendf(replaces, "replace %s => %q\n", path, d)
		sum, err := os.ReadFile(filepath.Join(d, "go.sum"))
		if err != nil {
			t.Fatal(err)
		}
		sums = append(sums, sum...)
	}
	dir := t.TempDir()
	mod := fmt.Sprintf("module readme\n\ngo %s\n\n%s\n%s", version, requires, replaces)
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(mod), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), sums, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// newer reports whether go version a (a go line's "1.26.0") is later than b.
func newer(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := range max(len(as), len(bs)) {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x > y
		}
	}
	return false
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
	root, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
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
	dir := snippetModule(t, root, src)
	if err := os.Mkdir(filepath.Join(dir, "outbox"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "outbox", "main.go"), src, 0o644); err != nil {
		t.Fatal(err)
	}
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
