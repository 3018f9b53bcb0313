package idempotency_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/reliability"
)

// nearlyDoneStore reports every in-flight record's lease as about to end,
// as a store with a skewed clock or a corrupt lease may, again and again.
type nearlyDoneStore struct {
	idempotency.Store
	acquires atomic.Int64
}

func (s *nearlyDoneStore) Acquire(ctx context.Context, req idempotency.AcquireRequest) (idempotency.Acquisition, error) {
	s.acquires.Add(1)
	a, err := s.Store.Acquire(ctx, req)
	if a.Outcome == idempotency.InFlight {
		a.LeaseRemaining = time.Millisecond
	}
	return a, err
}

// TestWaitRecheckFloor: a waiter whose store keeps saying the holder's lease
// ends in a millisecond re-checks at most every 25ms, not in a loop.
func TestWaitRecheckFloor(t *testing.T) {
	const bound = 300 * time.Millisecond
	store := &nearlyDoneStore{Store: newMemStore(t)}
	entered, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	h := idempotency.New(store, idempotency.WithWait(bound))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
	}))
	go do(h, http.MethodPost, "k", "")
	<-entered
	before := store.acquires.Load()
	start := time.Now()
	if res := do(h, http.MethodPost, "k", ""); res.StatusCode != http.StatusConflict {
		t.Fatalf("waiter: %d, want 409 at the bound", res.StatusCode)
	}
	waited := time.Since(start)
	checks := store.acquires.Load() - before
	if limit := int64(waited/(25*time.Millisecond)) + 2; checks > limit {
		t.Fatalf("%d checks in %v: more than one per 25ms (%d)", checks, waited, limit)
	}
	reliability.Report(t, reliability.Result{Scenario: "fault: store says a lease ends in 1ms, again and again", Store: "memstore",
		Operations: checks, Faults: checks,
		Note: fmt.Sprintf("waiter re-checked %d times in %v (was ~270)", checks, waited.Round(time.Millisecond))})
}

// frozenWatchStore's Watch does not answer until its context ends, as a
// subscription on a frozen node does.
type frozenWatchStore struct{ idempotency.Store }

func (frozenWatchStore) Watch(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	<-ctx.Done()
	return nil, nil, ctx.Err()
}

// TestWaitBoundHoldsWhenWatchHangs: the wait bound bounds the whole wait,
// store calls included: a Watch that does not answer does not keep the
// duplicate past it.
func TestWaitBoundHoldsWhenWatchHangs(t *testing.T) {
	const bound = 300 * time.Millisecond
	entered, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	h := idempotency.New(frozenWatchStore{newMemStore(t)}, idempotency.WithWait(bound))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
	}))
	go do(h, http.MethodPost, "k", "")
	<-entered
	done := make(chan *http.Response, 1)
	start := time.Now()
	go func() { done <- do(h, http.MethodPost, "k", "") }()
	select {
	case res := <-done:
		if res.StatusCode != http.StatusConflict {
			t.Fatalf("waiter: %d, want 409 at the bound", res.StatusCode)
		}
		if waited := time.Since(start); waited > bound+time.Second {
			t.Fatalf("waiter answered after %v, bound %v", waited, bound)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a hanging Watch kept the waiter past its bound")
	}
}
