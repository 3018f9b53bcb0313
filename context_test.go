package idempotency

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

type ctxKey struct{}

// newHandlerContext returns a handlerContext over a cancellable parent that
// carries a value, and the parent's cancel function.
func newHandlerContext(t *testing.T) (*handlerContext, context.CancelCauseFunc) {
	t.Helper()
	parent, cancel := context.WithCancelCause(context.WithValue(context.Background(), ctxKey{}, "v"))
	t.Cleanup(func() { cancel(nil) })
	return &handlerContext{parent: parent}, cancel
}

// closed reports whether ch is closed, without waiting.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestHandlerContextLeaseLost(t *testing.T) {
	lost := errors.New("lease gone")
	for _, doneFirst := range []bool{false, true} {
		hc, _ := newHandlerContext(t)
		var done <-chan struct{}
		if doneFirst {
			done = hc.Done()
			if closed(done) || hc.Err() != nil {
				t.Fatalf("doneFirst=%v: cancelled before the lease was lost: %v", doneFirst, hc.Err())
			}
		}
		hc.lose(lost)
		if done == nil {
			done = hc.Done()
		}
		if !closed(done) {
			t.Errorf("doneFirst=%v: Done not closed after the lease was lost", doneFirst)
		}
		if !errors.Is(hc.Err(), context.Canceled) {
			t.Errorf("doneFirst=%v: Err %v, want context.Canceled", doneFirst, hc.Err())
		}
		if got := context.Cause(hc); got != lost {
			t.Errorf("doneFirst=%v: Cause %v, want %v", doneFirst, got, lost)
		}
		if got := hc.Value(ctxKey{}); got != "v" {
			t.Errorf("doneFirst=%v: Value %v, want the parent's", doneFirst, got)
		}
	}
}

// TestHandlerContextDerived: a context derived from the handler's before the
// lease is lost is cancelled with the same cause.
func TestHandlerContextDerived(t *testing.T) {
	hc, _ := newHandlerContext(t)
	child, cancel := context.WithTimeout(hc, time.Hour)
	defer cancel()
	lost := errors.New("lease gone")
	hc.lose(lost)
	if !closed(child.Done()) {
		t.Fatal("derived context not cancelled")
	}
	if got := context.Cause(child); got != lost {
		t.Fatalf("derived Cause %v, want %v", got, lost)
	}
}

// TestHandlerContextParentCancelled: the request's cancellation (the client
// went away) reaches the handler whether or not Done was called before it.
func TestHandlerContextParentCancelled(t *testing.T) {
	gone := errors.New("client gone")
	for _, doneFirst := range []bool{false, true} {
		hc, cancelParent := newHandlerContext(t)
		var done <-chan struct{}
		if doneFirst {
			done = hc.Done()
		}
		cancelParent(gone)
		if !errors.Is(hc.Err(), context.Canceled) {
			t.Errorf("doneFirst=%v: Err %v, want context.Canceled", doneFirst, hc.Err())
		}
		if got := context.Cause(hc); got != gone {
			t.Errorf("doneFirst=%v: Cause %v, want %v", doneFirst, got, gone)
		}
		if done == nil {
			done = hc.Done()
		}
		if !closed(done) {
			t.Errorf("doneFirst=%v: Done not closed after the parent was cancelled", doneFirst)
		}
	}
}

// TestHandlerContextEnd: once the handler has returned its context is
// cancelled, as a deferred cancel would leave it, made or not.
func TestHandlerContextEnd(t *testing.T) {
	for _, doneFirst := range []bool{false, true} {
		hc, _ := newHandlerContext(t)
		var done <-chan struct{}
		if doneFirst {
			done = hc.Done()
		}
		hc.end()
		if hc.Err() != context.Canceled {
			t.Errorf("doneFirst=%v: Err %v after end, want context.Canceled", doneFirst, hc.Err())
		}
		if got := context.Cause(hc); got != context.Canceled {
			t.Errorf("doneFirst=%v: Cause %v after end, want context.Canceled", doneFirst, got)
		}
		if done == nil {
			done = hc.Done()
		}
		if !closed(done) {
			t.Errorf("doneFirst=%v: Done not closed after end", doneFirst)
		}
		if hc.Err() != context.Canceled {
			t.Errorf("doneFirst=%v: Err %v once made after end", doneFirst, hc.Err())
		}
	}
}

// TestHandlerContextLazy: a handler that never waits on its context costs no
// allocation for it, and sees the request context's values and deadline.
func TestHandlerContextLazy(t *testing.T) {
	deadline := time.Now().Add(time.Hour)
	parent, cancel := context.WithDeadline(context.WithValue(context.Background(), ctxKey{}, "v"), deadline)
	defer cancel()
	hc := &handlerContext{parent: parent} // a field of the request, which is allocated anyway
	allocs := testing.AllocsPerRun(100, func() {
		hc.state.Store(ctxLazy)
		if hc.Err() != nil || hc.Value(ctxKey{}) != "v" {
			t.Fatal("lazy context differs from its parent")
		}
		if d, ok := hc.Deadline(); !ok || !d.Equal(deadline) {
			t.Fatalf("Deadline %v %v, want %v", d, ok, deadline)
		}
		hc.end()
	})
	if allocs != 0 {
		t.Fatalf("a context nobody waits on allocated %v times", allocs)
	}
}

// TestHandlerContextConcurrent: goroutines that wait on the context while the
// lease is lost all see one channel close and one cause.
func TestHandlerContextConcurrent(t *testing.T) {
	for round := 0; round < 50; round++ {
		hc, _ := newHandlerContext(t)
		lost := errors.New("lease gone")
		const waiters = 16
		var wg sync.WaitGroup
		chans := make([]<-chan struct{}, waiters)
		causes := make([]error, waiters)
		start := make(chan struct{})
		for i := 0; i < waiters; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_ = hc.Err()
				chans[i] = hc.Done()
				<-chans[i]
				causes[i] = context.Cause(hc)
			}()
		}
		close(start)
		hc.lose(lost)
		wg.Wait()
		hc.end()
		for i := range chans {
			if chans[i] != chans[0] {
				t.Fatalf("round %d: waiter %d got another Done channel", round, i)
			}
			if causes[i] != lost {
				t.Fatalf("round %d: waiter %d saw cause %v", round, i, causes[i])
			}
		}
	}
}
