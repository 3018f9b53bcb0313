package outboxtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/outbox/relay"
)

// Start runs the relay that newRelay returns, given a fast backoff and an
// observer, until t ends, and returns its events; the test fails when Run
// returns anything but context.Canceled, or not within 30s of the end.
// opts come after the backoff, so a test can set its own.
func Start(t testing.TB, newRelay func(opts ...relay.Option) *relay.Relay, opts ...relay.Option) *Events {
	t.Helper()
	ev := NewEvents()
	opts = append([]relay.Option{relay.WithBackoff(5*time.Millisecond, 50*time.Millisecond), relay.WithObserver(ev.Observe)}, opts...)
	r := newRelay(opts...)
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
