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

	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/outbox/relay"
)

// The SQLite mode's tests run on a file in the test's temporary
// directory: the scheduled captures and the state records through the
// tests of captures_test.go and states_test.go, which PostgreSQL mode
// runs too, and the restart with the server run as main runs it (run).

// sqliteMode opens the SQLite mode on a file in the test's temporary
// directory, as main does with -sqlite.
func sqliteMode(t *testing.T) *backend {
	t.Helper()
	return openSQLiteFile(t, filepath.Join(t.TempDir(), "payments.db"))
}

// openSQLiteFile opens the SQLite mode on file.
func openSQLiteFile(t *testing.T, file string) *backend {
	t.Helper()
	b, err := openSQLite(context.Background(), file, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSQLiteCapture: a payment's capture runs once when it falls due,
// after -capture-after.
func TestSQLiteCapture(t *testing.T) { testCapture(t, sqliteMode) }

// TestSQLiteCancelCapture: a cancel before the capture falls due stops it.
func TestSQLiteCancelCapture(t *testing.T) { testCancelCapture(t, sqliteMode) }

// TestSQLiteCancelRacesCapture: cancels around the time the capture runs:
// one of the two happens, never both.
func TestSQLiteCancelRacesCapture(t *testing.T) { testCancelRacesCapture(t, sqliteMode) }

// TestSQLiteCaptureThenCancel: a capture wins; a later cancel with another
// key is 409 state_conflict.
func TestSQLiteCaptureThenCancel(t *testing.T) { testCaptureThenCancel(t, sqliteMode) }

// TestSQLiteCaptureRacesCancel: a capture and a cancel sent at once with
// different keys: one winner, and 409 state_conflict for the other.
func TestSQLiteCaptureRacesCancel(t *testing.T) { testCaptureRacesCancel(t, sqliteMode) }

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

// runSQLite runs the server on file, as `chi-server -sqlite file
// -capture-after after` does, on a free loopback port, until its stop is
// called or t ends. The captures' relay reports to watch.
func runSQLite(t *testing.T, file string, after time.Duration, watch *captureWatch) *server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := newBanner()
	done := make(chan error, 1)
	s := settings{addr: "127.0.0.1:0", sqlitePath: file, captureAfter: after, captureRelay: []relay.Option{relay.WithObserver(watch.observe)}}
	go func() { done <- run(ctx, s, out, slog.New(slog.DiscardHandler)) }()
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
// table holds one row, and the payment reads back from it. Its capture,
// scheduled before the stop and due while the server was down, runs after
// the restart, once: the relay finds it in the file.
func TestSQLiteRestartReplays(t *testing.T) {
	file := filepath.Join(t.TempDir(), "payments.db")
	const body = `{"amount":1999,"currency":"EUR"}`

	before := newCaptureWatch(t)
	srv := runSQLite(t, file, time.Hour, before)
	first, firstBody := srv.post("/payments", aliceToken, "order-1001", body)
	p := decode(t, firstBody)
	if first.StatusCode != http.StatusCreated || first.Header.Get("Idempotent-Replayed") != "" ||
		p.Status != stateAuthorized || p.State != stateAuthorized || p.Version != 1 || p.CaptureAt == nil || !p.CaptureAt.After(p.Created) {
		t.Fatalf("first: %d %v %s", first.StatusCode, first.Header, firstBody)
	}
	loc := first.Header.Get("Location")
	// run prints the whole banner before it serves: it is all there once a
	// request was answered.
	if b := srv.banner.String(); !strings.Contains(b, "(store: sqlite "+file+")") ||
		!strings.Contains(b, "start it again with the same\nfile (-sqlite "+file+")") ||
		!strings.Contains(b, "a capture scheduled before the stop\nruns after the restart") ||
		!strings.Contains(b, "captured 1h0m0s later by the server's relay") || !strings.Contains(b, "/payments/$ID/cancel") {
		t.Fatalf("the banner does not name the file, the restart or the captures:\n%s", b)
	}
	if res, b := srv.get(loc, aliceToken); res.StatusCode != http.StatusOK || b != firstBody {
		t.Fatalf("GET %s: %d %s; want %s", loc, res.StatusCode, b, firstBody)
	}
	srv.stop()
	if n := before.captured(); n != 0 {
		t.Fatalf("%d captures ran before the restart, an hour early", n)
	}

	// The hour passes while the server is down: the capture falls due.
	b := openSQLiteFile(t, file)
	bringForward(t, b)
	b.close()

	after := newCaptureWatch(t)
	srv = runSQLite(t, file, time.Hour, after)
	again, againBody := srv.post("/payments", aliceToken, "order-1001", body)
	if again.StatusCode != http.StatusCreated || again.Header.Get("Idempotent-Replayed") != "true" || againBody != firstBody {
		t.Fatalf("after the restart: %d %v %s; want the replay of %s", again.StatusCode, again.Header, againBody, firstBody)
	}
	if l := again.Header.Get("Location"); l != loc {
		t.Fatalf("Location %q after the restart, %q before", l, loc)
	}
	after.awaitCaptured(1, 10*time.Second)
	res, got := srv.get(loc, aliceToken)
	if c := decode(t, got); res.StatusCode != http.StatusOK || c.ID != p.ID || !c.Created.Equal(p.Created) || c.Status != stateCaptured ||
		c.State != stateCaptured || c.Version != 2 || c.CaptureAt == nil || c.CaptureAt.Before(p.Created) {
		t.Fatalf("GET %s after the capture: %d %s", loc, res.StatusCode, got)
	}
	if n := srv.executed(); n != 1 {
		t.Fatalf("%d rows in the payments table, want 1", n)
	}
	if res, _ := srv.get(loc, bobToken); res.StatusCode != http.StatusNotFound {
		t.Fatalf("bob's GET of alice's payment: %d", res.StatusCode)
	}
	srv.stop()
	if n := after.captured(); n != 1 {
		t.Fatalf("%d captures ran after the restart, want 1", n)
	}

	// The file holds the capture's one run: its message done, the record's
	// one transition.
	b = openSQLiteFile(t, file)
	defer b.close()
	if st, lastError := captureMessage(t, b, p.ID); st != lifecycle.Done || lastError != "" {
		t.Errorf("the capture message is %s (%q), want done", st, lastError)
	}
	history, err := b.states.History(context.Background(), paymentRef("alice", p.ID), 0, 0)
	if err != nil || len(history) != 1 || history[0].From != stateAuthorized || history[0].To != stateCaptured {
		t.Errorf("history %+v (%v), want the capture alone", history, err)
	}
}

// TestSQLiteProviderFailureRollsBack: in SQLite mode, as in PostgreSQL
// mode, a payment whose provider fails after its INSERT answers 502 and
// leaves no row, and its key is released: the retry pays once.
func TestSQLiteProviderFailureRollsBack(t *testing.T) {
	srv := runSQLite(t, filepath.Join(t.TempDir(), "payments.db"), time.Hour, newCaptureWatch(t))
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
