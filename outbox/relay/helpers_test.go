package relay_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency/internal/outboxtest"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/relay"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	os.Exit(m.Run())
}

// events collects a relay's events.
type events struct {
	mu      sync.Mutex
	all     []relay.Event
	changed chan struct{}
}

func newEvents() *events { return &events{changed: make(chan struct{})} }

func (e *events) observe(_ context.Context, ev relay.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.all = append(e.all, ev)
	close(e.changed)
	e.changed = make(chan struct{})
}

// of returns the events of kind k.
func (e *events) of(k relay.EventKind) []relay.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []relay.Event
	for _, ev := range e.all {
		if ev.Kind == k {
			out = append(out, ev)
		}
	}
	return out
}

// await waits until cond holds, checking it at every event, for at most
// d, and fails t otherwise.
func (e *events) await(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		e.mu.Lock()
		changed := e.changed
		e.mu.Unlock()
		if cond() {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			if !cond() {
				t.Fatalf("%s: not within %v", what, d)
			}
			return
		}
	}
}

// start runs a relay on pool through sink until t ends, with a fast
// backoff unless opts set one, and returns its events.
func start(t testing.TB, pool *pgxpool.Pool, sink outbox.Sink, opts ...relay.Option) *events {
	t.Helper()
	ev := newEvents()
	opts = append([]relay.Option{relay.WithBackoff(5*time.Millisecond, 50*time.Millisecond), relay.WithObserver(ev.observe)}, opts...)
	r := relay.New(pool, sink, opts...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Run returned %v, want context.Canceled", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("Run did not return within 30s of its context's end")
		}
	})
	return ev
}

// enqueueN enqueues n records of perRecord messages each (topic "t",
// payload "<record>/<message>"), and returns the IDs.
func enqueueN(t testing.TB, db *outboxtest.DB, prefix string, n, perRecord int) []string {
	t.Helper()
	var ids []string
	for i := range n {
		msgs := make([]outbox.Message, perRecord)
		for j := range msgs {
			msgs[j] = outbox.Message{Topic: "t", Payload: fmt.Appendf(nil, "%d/%d", i, j)}
		}
		ids = append(ids, db.Enqueue(t, fmt.Sprintf("%s-%d", prefix, i), msgs...)...)
	}
	return ids
}
