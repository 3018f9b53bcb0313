package relay_test

import (
	"context"
	"errors"
	"fmt"
	"os"
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
type events = outboxtest.Events

func newEvents() *events { return outboxtest.NewEvents() }

// start runs a relay on pool through sink until t ends, with a fast
// backoff unless opts set one, and returns its events.
func start(t testing.TB, pool *pgxpool.Pool, sink outbox.Sink, opts ...relay.Option) *events {
	t.Helper()
	ev := newEvents()
	opts = append([]relay.Option{relay.WithBackoff(5*time.Millisecond, 50*time.Millisecond), relay.WithObserver(ev.Observe)}, opts...)
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
