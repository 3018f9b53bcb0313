package outboxtest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/outbox/relay"
)

// Events collects a relay's events (its Observe is a relay.WithObserver
// function) and lets a test wait for a condition on them without polling.
type Events struct {
	mu      sync.Mutex
	all     []relay.Event
	changed chan struct{} // closed and replaced at every event
}

// NewEvents returns an empty collection.
func NewEvents() *Events { return &Events{changed: make(chan struct{})} }

// Observe records ev.
func (e *Events) Observe(_ context.Context, ev relay.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.all = append(e.all, ev)
	close(e.changed)
	e.changed = make(chan struct{})
}

// Of returns the events of kind k.
func (e *Events) Of(k relay.EventKind) []relay.Event {
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

// Await waits until cond holds, checking it at every event, for at most
// d, and fails t otherwise.
func (e *Events) Await(t testing.TB, d time.Duration, what string, cond func() bool) {
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
