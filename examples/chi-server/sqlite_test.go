package main

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The SQLite mode's tests run the server as main does, with run, on a
// file in the test's temporary directory.

// banner is the writer run prints its banner to: it keeps the text and
// hands over the address of the first line ("chi-server listening on
// http://ADDR (store: ...)") once it is written.
type banner struct {
	mu   sync.Mutex
	text bytes.Buffer
	addr chan string // gets the address once
	sent bool
}

func newBanner() *banner { return &banner{addr: make(chan string, 1)} }

func (b *banner) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.text.Write(p)
	if first, _, ok := strings.Cut(b.text.String(), "\n"); ok && !b.sent {
		b.sent = true
		rest, _ := strings.CutPrefix(first, "chi-server listening on http://")
		addr, _, _ := strings.Cut(rest, " ")
		b.addr <- addr
	}
	return len(p), nil
}

func (b *banner) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.text.String()
}

// server is run serving the API on a SQLite file.
type server struct {
	client
	banner *banner
	stop   func() // stops run and waits for it to return
}

// runSQLite runs the server on file, as `chi-server -sqlite file` does, on
// a free loopback port, until its stop is called or t ends.
func runSQLite(t *testing.T, file string) *server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := newBanner()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, settings{addr: "127.0.0.1:0", sqlitePath: file}, out, slog.New(slog.DiscardHandler))
	}()
	var addr string
	select {
	case addr = <-out.addr:
	case err := <-done:
		cancel()
		t.Fatalf("run returned before it served: %v", err)
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatal("run printed no banner within 30s")
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("run returned %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return &server{client: client{t, "http://" + addr}, banner: out, stop: stop}
}

// TestSQLiteRestartReplays: a payment made on a server running on a SQLite
// file, which is then stopped and started again on the same file, as the
// banner says: the same request replays the stored response
// (Idempotent-Replayed: true, the same body and Location), the payments
// table holds one row, and the payment reads back from it.
func TestSQLiteRestartReplays(t *testing.T) {
	file := filepath.Join(t.TempDir(), "payments.db")
	const body = `{"amount":1999,"currency":"EUR"}`

	srv := runSQLite(t, file)
	first, firstBody := srv.post("/payments", aliceToken, "order-1001", body)
	if first.StatusCode != http.StatusCreated || first.Header.Get("Idempotent-Replayed") != "" || !strings.Contains(firstBody, `"status":"captured"`) {
		t.Fatalf("first: %d %v %s", first.StatusCode, first.Header, firstBody)
	}
	// run prints the whole banner before it serves: it is all there once a
	// request was answered.
	if b := srv.banner.String(); !strings.Contains(b, "(store: sqlite "+file+")") ||
		!strings.Contains(b, "start it again with the same\nfile (-sqlite "+file+")") {
		t.Fatalf("the banner does not name the file or the restart:\n%s", b)
	}
	srv.stop()

	srv = runSQLite(t, file)
	again, againBody := srv.post("/payments", aliceToken, "order-1001", body)
	if again.StatusCode != http.StatusCreated || again.Header.Get("Idempotent-Replayed") != "true" || againBody != firstBody {
		t.Fatalf("after the restart: %d %v %s; want the replay of %s", again.StatusCode, again.Header, againBody, firstBody)
	}
	if loc := again.Header.Get("Location"); loc == "" || loc != first.Header.Get("Location") {
		t.Fatalf("Location %q after the restart, %q before", loc, first.Header.Get("Location"))
	}
	if n := srv.executed(); n != 1 {
		t.Fatalf("%d rows in the payments table, want 1", n)
	}
	if res, b := srv.get(first.Header.Get("Location"), aliceToken); res.StatusCode != http.StatusOK || b != firstBody {
		t.Fatalf("GET %s: %d %s; want %s", first.Header.Get("Location"), res.StatusCode, b, firstBody)
	}
	if res, _ := srv.get(first.Header.Get("Location"), bobToken); res.StatusCode != http.StatusNotFound {
		t.Fatalf("bob's GET of alice's payment: %d", res.StatusCode)
	}
}

// TestSQLiteProviderFailureRollsBack: in SQLite mode, as in PostgreSQL
// mode, a payment whose provider fails after its INSERT answers 502 and
// leaves no row, and its key is released: the retry pays once.
func TestSQLiteProviderFailureRollsBack(t *testing.T) {
	srv := runSQLite(t, filepath.Join(t.TempDir(), "payments.db"))
	const body = `{"amount":700,"currency":"EUR"}`
	if res, b := srv.post("/payments?provider=down", aliceToken, "order-5", body); res.StatusCode != http.StatusBadGateway {
		t.Fatalf("provider down: %d %s", res.StatusCode, b)
	}
	if n := srv.executed(); n != 0 {
		t.Fatalf("%d rows after a 502, want 0", n)
	}
	res, b := srv.post("/payments", aliceToken, "order-5", body)
	if res.StatusCode != http.StatusCreated || res.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry: %d %v %s", res.StatusCode, res.Header, b)
	}
	if res, again := srv.post("/payments", aliceToken, "order-5", body); res.Header.Get("Idempotent-Replayed") != "true" || again != b {
		t.Fatalf("duplicate: %d %v %s", res.StatusCode, res.Header, again)
	}
	if n := srv.executed(); n != 1 {
		t.Fatalf("%d rows after the retry and its duplicate, want 1", n)
	}
}
