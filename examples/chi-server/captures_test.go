package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/outbox/relay"
)

// The scheduled captures and the state records run the same in
// PostgreSQL and SQLite modes: each test of both is a function of the
// mode's backend, run by a TestPostgres… here and a TestSQLite… in
// sqlite_test.go.

// opener opens the backend of a database mode for a test.
type opener func(t *testing.T) *backend

// postgresMode opens the PostgreSQL mode on a database of the test's own,
// as main does with DATABASE_URL.
func postgresMode(t *testing.T) *backend {
	t.Helper()
	b, err := openBackend(context.Background(), "", pgtest.Database(t), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// captureWatch counts the captures a relay ran, from its events (not the
// state events it logged), and fails the test on an error, a fence or a
// retry of the relay.
type captureWatch struct {
	test      *testing.T
	mu        sync.Mutex
	published int
	changed   chan struct{}
}

func newCaptureWatch(t *testing.T) *captureWatch {
	return &captureWatch{test: t, changed: make(chan struct{})}
}

// observe is the relay's observer (relay.WithObserver).
func (w *captureWatch) observe(_ context.Context, e relay.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if e.Kind == relay.EventPublished && e.Topic == topicCapture {
		w.published++
	}
	if e.Kind == relay.EventError || e.Kind == relay.EventFenced || e.Kind == relay.EventRetried {
		w.test.Errorf("relay event %v: %+v", e.Kind, e)
	}
	close(w.changed)
	w.changed = make(chan struct{})
}

// captured returns how many captures the relay ran.
func (w *captureWatch) captured() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.published
}

// awaitCaptured waits until the relay ran n captures, for at most d.
func (w *captureWatch) awaitCaptured(n int, d time.Duration) {
	w.test.Helper()
	deadline := time.After(d)
	for {
		w.mu.Lock()
		got, changed := w.published, w.changed
		w.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			w.test.Fatalf("%d captures ran, want %d within %v", got, n, d)
		}
	}
}

// captures is the API with scheduled captures on a backend, and the relay
// that runs them, as main runs them.
type captures struct {
	client
	*captureWatch
	b *backend
}

// serveCaptures serves the API on b with captures after after, and runs
// the relay of the captures, until t ends; then it closes b.
func serveCaptures(t *testing.T, b *backend, after time.Duration) *captures {
	t.Helper()
	t.Cleanup(b.close)
	api := newAPI(b, slog.New(slog.DiscardHandler))
	api.captureAfter = after
	srv := httptest.NewServer(api.routes())
	t.Cleanup(srv.Close)
	c := &captures{client: client{t, srv.URL}, captureWatch: newCaptureWatch(t), b: b}
	r := newCaptureRelay(b, slog.New(slog.DiscardHandler), relay.WithObserver(c.observe), relay.WithPollInterval(50*time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("the relay returned %v", err)
		}
	})
	return c
}

// queryRow runs query on b's database and reads its first row into dst.
// Its parameters are $1, $2…, which PostgreSQL and SQLite both take; its
// times are read, and bound, as the outbox's edges do (lifecycle.DB).
func queryRow(t *testing.T, b *backend, query string, args []any, dst ...any) {
	t.Helper()
	if err := lifecycle.QueryRow(context.Background(), b.payments.db, query, args, dst...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// bringForward makes the scheduled captures of b's database due now.
func bringForward(t *testing.T, b *backend) {
	t.Helper()
	const statement = `UPDATE idempotency_outbox SET due_at = $1 WHERE status = 'scheduled' AND topic = $2`
	if err := b.payments.db.Exec(context.Background(), statement, time.Now(), topicCapture); err != nil {
		t.Fatalf("%s: %v", statement, err)
	}
}

// captureMessage returns the state and last error of the capture message
// of the payment id in b's database.
func captureMessage(t *testing.T, b *backend, id string) (lifecycle.State, string) {
	t.Helper()
	var state lifecycle.State
	var lastError *string
	queryRow(t, b, `SELECT o.status, o.last_error FROM idempotency_outbox o
		JOIN payments p ON p.capture_id = o.storage_key || '/' || o.seq WHERE p.id = $1`, []any{mustPaymentID(t, id)}, &state, &lastError)
	if lastError == nil {
		return state, ""
	}
	return state, *lastError
}

// message returns the state and last error of the capture message of the
// payment id.
func (c *captures) message(id string) (lifecycle.State, string) {
	c.t.Helper()
	return captureMessage(c.t, c.b, id)
}

// pay makes a payment under key, and returns it.
func (c *captures) pay(key string) payment {
	c.t.Helper()
	res, body := c.post("/payments", aliceToken, key, `{"amount":1999,"currency":"EUR"}`)
	if res.StatusCode != http.StatusCreated {
		c.t.Fatalf("payment %s: %d %s", key, res.StatusCode, body)
	}
	return decode(c.t, body)
}

// read returns the payment id as alice reads it.
func (c *captures) read(id string) payment {
	c.t.Helper()
	res, body := c.get("/payments/"+id, aliceToken)
	if res.StatusCode != http.StatusOK {
		c.t.Fatalf("GET %s: %d %s", id, res.StatusCode, body)
	}
	return decode(c.t, body)
}

func decode(t *testing.T, body string) payment {
	t.Helper()
	var p payment
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	return p
}

// TestPostgresCapture: a payment is authorized with its capture scheduled
// in its transaction; the relay runs the capture when it falls due, and
// not before: the payment is captured, the message done, once. A
// duplicate of the payment schedules nothing more, a payment whose
// provider failed schedules nothing, and a cancel comes too late.
func TestPostgresCapture(t *testing.T) { testCapture(t, postgresMode) }

func testCapture(t *testing.T, open opener) {
	const after = 300 * time.Millisecond
	c := serveCaptures(t, open(t), after)
	p := c.pay("order-1")
	if p.Status != "authorized" || p.State != stateAuthorized || p.Version != 1 || p.CaptureAt == nil || p.CaptureAt.Before(p.Created) {
		t.Fatalf("made %+v, want authorized with its capture due", p)
	}
	if state, _ := c.message(p.ID); state != lifecycle.Scheduled {
		t.Fatalf("the capture message is %s, want scheduled", state)
	}
	if again := c.pay("order-1"); again.ID != p.ID {
		t.Fatalf("the duplicate made %+v", again)
	}
	if res, body := c.post("/payments?provider=down", aliceToken, "order-2", `{"amount":10,"currency":"EUR"}`); res.StatusCode != http.StatusBadGateway {
		t.Fatalf("provider down: %d %s", res.StatusCode, body)
	}

	c.awaitCaptured(1, 10*time.Second)
	got := c.read(p.ID)
	if got.Status != "captured" || got.State != stateCaptured || got.Version != 2 || got.CaptureAt == nil || got.CaptureAt.Before(*p.CaptureAt) {
		t.Errorf("after the capture: %+v, want captured at or after %v", got, p.CaptureAt)
	}
	if state, lastError := c.message(p.ID); state != lifecycle.Done || lastError != "" {
		t.Errorf("the capture message is %s (%q), want done", state, lastError)
	}
	var messages int64
	queryRow(t, c.b, `SELECT count(*) FROM idempotency_outbox WHERE topic = $1`, []any{topicCapture}, &messages)
	if messages != 1 {
		t.Errorf("%d capture messages, want 1", messages)
	}
	if res, body := c.post("/payments/"+p.ID+"/cancel", aliceToken, "cancel-1", ""); res.StatusCode != http.StatusConflict ||
		!conflictOf(t, body, stateCaptured, 2) {
		t.Errorf("cancel after the capture: %d %s, want 409 state_conflict, captured at version 2", res.StatusCode, body)
	}
}

// TestPostgresCancelCapture: a payment canceled before its capture runs is
// canceled with its capture message, in the cancel's transaction; the
// capture never runs. The cancel's duplicate replays it, a later cancel
// (another key) is a conflict with the canceled record, and another
// user's cancel finds no payment.
func TestPostgresCancelCapture(t *testing.T) { testCancelCapture(t, postgresMode) }

func testCancelCapture(t *testing.T, open opener) {
	c := serveCaptures(t, open(t), time.Hour)
	p := c.pay("order-1")
	if res, body := c.post("/payments/"+p.ID+"/cancel", bobToken, "cancel-1", ""); res.StatusCode != http.StatusNotFound {
		t.Fatalf("bob's cancel: %d %s, want 404", res.StatusCode, body)
	}
	res, body := c.post("/payments/"+p.ID+"/cancel", aliceToken, "cancel-1", "")
	if got := decode(t, body); res.StatusCode != http.StatusOK || got.Status != "canceled" || got.State != stateCanceled || got.Version != 2 {
		t.Fatalf("cancel: %d %s", res.StatusCode, body)
	}
	if state, lastError := c.message(p.ID); state != lifecycle.Canceled || lastError != "canceled: by outbox.Cancel" {
		t.Errorf("the capture message is %s (%q), want canceled", state, lastError)
	}
	if again, againBody := c.post("/payments/"+p.ID+"/cancel", aliceToken, "cancel-1", ""); again.StatusCode != http.StatusOK ||
		again.Header.Get("Idempotent-Replayed") != "true" || againBody != body {
		t.Errorf("the cancel's duplicate: %d %v %s", again.StatusCode, again.Header, againBody)
	}
	if later, laterBody := c.post("/payments/"+p.ID+"/cancel", aliceToken, "cancel-2", ""); later.StatusCode != http.StatusConflict ||
		!conflictOf(t, laterBody, stateCanceled, 2) {
		t.Errorf("a later cancel: %d %s, want 409 state_conflict, canceled at version 2", later.StatusCode, laterBody)
	}
	if got := c.read(p.ID); got.Status != "canceled" || got.CaptureAt != nil {
		t.Errorf("read %+v, want canceled", got)
	}
	// Another payment's capture, brought forward, runs; the canceled one
	// never does.
	q := c.pay("order-2")
	bringForward(t, c.b)
	c.awaitCaptured(1, 10*time.Second) // order-2's, brought forward
	if got := c.read(q.ID); got.Status != "captured" {
		t.Errorf("order-2 %+v, want captured", got)
	}
	if got := c.read(p.ID); got.Status != "canceled" {
		t.Errorf("order-1 %+v, want still canceled", got)
	}
}

// TestPostgresCancelRacesCapture: payments canceled around the time their
// capture runs: each ends either captured, its message done and its
// cancel answered 409, or canceled, its message canceled and its cancel
// answered 200; never both, never neither.
func TestPostgresCancelRacesCapture(t *testing.T) { testCancelRacesCapture(t, postgresMode) }

func testCancelRacesCapture(t *testing.T, open opener) {
	const n, after = 12, 200 * time.Millisecond
	c := serveCaptures(t, open(t), after)
	var wg sync.WaitGroup
	statuses := make([]int, n)
	ids := make([]string, n)
	for i := range n {
		p := c.pay(fmt.Sprintf("order-%d", i))
		ids[i] = p.ID
		// Cancels spread from a little before the capture falls due to a
		// little after.
		at := p.CaptureAt.Add(time.Duration(i-n/2) * 15 * time.Millisecond)
		wg.Go(func() {
			time.Sleep(time.Until(at)) // aiming at the capture's time is the test
			req, _ := http.NewRequest(http.MethodPost, c.url+"/payments/"+p.ID+"/cancel", nil)
			req.Header.Set("Authorization", "Bearer "+aliceToken)
			req.Header.Set("Idempotency-Key", "cancel-"+p.ID)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			res.Body.Close()
			statuses[i] = res.StatusCode
		})
	}
	wg.Wait()
	// A cancel answered 409 only once the capture had committed, and 200
	// once it had canceled it: every payment has ended.
	captured := 0
	for i, id := range ids {
		got := c.read(id)
		state, _ := c.message(id)
		switch {
		case got.Status == "captured" && state == lifecycle.Done && statuses[i] == http.StatusConflict:
			captured++
		case got.Status == "canceled" && state == lifecycle.Canceled && statuses[i] == http.StatusOK:
		default:
			t.Errorf("%s: %s, its capture %s, its cancel answered %d", id, got.Status, state, statuses[i])
		}
	}
	t.Logf("%d of %d payments captured before their cancel", captured, n)
}
