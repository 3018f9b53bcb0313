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

// captures is the API in PostgreSQL mode with scheduled captures, and the
// relay that runs them, as main runs them with DATABASE_URL.
type captures struct {
	client
	b *backend
	// published counts the captures the relay ran (not the state events
	// it logged).
	mu        sync.Mutex
	published int
	changed   chan struct{}
}

// serveCaptures serves the API on a database of its own with captures
// after after, and runs the relay of the captures, until t ends.
func serveCaptures(t *testing.T, after time.Duration) *captures {
	t.Helper()
	b, err := openBackend(context.Background(), "", pgtest.Database(t), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.close)
	api := newAPI(b.store, b.db, slog.New(slog.DiscardHandler))
	api.captureAfter = after
	srv := httptest.NewServer(api.routes())
	t.Cleanup(srv.Close)
	c := &captures{client: client{t, srv.URL}, b: b, changed: make(chan struct{})}
	r := newCaptureRelay(b.db, b.store, slog.New(slog.DiscardHandler), relay.WithObserver(c.observe), relay.WithPollInterval(50*time.Millisecond))
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

func (c *captures) observe(_ context.Context, e relay.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.Kind == relay.EventPublished && e.Topic == topicCapture {
		c.published++
	}
	if e.Kind == relay.EventError || e.Kind == relay.EventFenced || e.Kind == relay.EventRetried {
		c.t.Errorf("relay event %v: %+v", e.Kind, e)
	}
	close(c.changed)
	c.changed = make(chan struct{})
}

// awaitCaptured waits until the relay ran n captures, for at most d.
func (c *captures) awaitCaptured(n int, d time.Duration) {
	c.t.Helper()
	deadline := time.After(d)
	for {
		c.mu.Lock()
		got, changed := c.published, c.changed
		c.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			c.t.Fatalf("%d captures ran, want %d within %v", got, n, d)
		}
	}
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

// message returns the state and last error of the capture message of the
// payment id.
func (c *captures) message(id string) (lifecycle.State, string) {
	c.t.Helper()
	n, _ := parsePaymentID(id)
	var state lifecycle.State
	var lastError *string
	err := c.b.db.QueryRow(context.Background(), `SELECT o.status, o.last_error FROM idempotency_outbox o
		JOIN payments p ON p.capture_id = o.storage_key || '/' || o.seq WHERE p.id = $1`, n).Scan(&state, &lastError)
	if err != nil {
		c.t.Fatalf("the capture message of %s: %v", id, err)
	}
	if lastError == nil {
		return state, ""
	}
	return state, *lastError
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
func TestPostgresCapture(t *testing.T) {
	const after = 300 * time.Millisecond
	c := serveCaptures(t, after)
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
	var messages int
	if err := c.b.db.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_outbox WHERE topic = $1`, topicCapture).Scan(&messages); err != nil || messages != 1 {
		t.Errorf("%d capture messages (%v), want 1", messages, err)
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
func TestPostgresCancelCapture(t *testing.T) {
	c := serveCaptures(t, time.Hour)
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
	if _, err := c.b.db.Exec(context.Background(), `UPDATE idempotency_outbox SET due_at = now() WHERE status = 'scheduled'`); err != nil {
		t.Fatal(err)
	}
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
func TestPostgresCancelRacesCapture(t *testing.T) {
	const n, after = 12, 200 * time.Millisecond
	c := serveCaptures(t, after)
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
