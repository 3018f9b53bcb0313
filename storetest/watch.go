package storetest

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

// quietPeriod is how long a Watch channel must stay open when nothing
// happened to its key.
const quietPeriod = 150 * time.Millisecond

// watch calls Watch and fails the subtest on error.
func (h *harness) watch(key string) (<-chan struct{}, func()) {
	h.t.Helper()
	ch, stop, err := h.s.Watch(h.ctx(), key)
	if err != nil {
		h.t.Fatalf("Watch: %v", err)
	}
	if ch == nil || stop == nil {
		h.t.Fatalf("Watch returned a nil channel or stop function")
	}
	return ch, stop
}

var watchCases = []testCase{
	{"Complete", func(t *testing.T, h *harness) {
		key, owner := newKey(), newToken()
		h.acquireWant(req(key, owner, "fp", longLease, longTTL), idempotency.Acquired, 1)
		ch, stop := h.watch(key)
		defer stop()
		h.complete(key, owner, sampleResponse("a"), longTTL)
		if !closedWithin(ch, waitBound) {
			t.Fatalf("Watch channel not closed within %v of Complete", waitBound)
		}
		h.wantReplay(key, "fp", sampleResponse("a"))
	}},
	{"Release", func(t *testing.T, h *harness) {
		key, owner := newKey(), newToken()
		h.acquireWant(req(key, owner, "fp", longLease, longTTL), idempotency.Acquired, 1)
		ch, stop := h.watch(key)
		defer stop()
		if err := h.s.Release(h.ctx(), key, owner); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if !closedWithin(ch, waitBound) {
			t.Fatalf("Watch channel not closed within %v of Release", waitBound)
		}
	}},
	{"OtherKey", func(t *testing.T, h *harness) {
		mine, other := newKey(), newKey()
		mineOwner, otherOwner := newToken(), newToken()
		h.acquireWant(req(mine, mineOwner, "fp", longLease, longTTL), idempotency.Acquired, 1)
		h.acquireWant(req(other, otherOwner, "fp", longLease, longTTL), idempotency.Acquired, 1)
		ch, stop := h.watch(mine)
		defer stop()
		otherCh, otherStop := h.watch(other)
		defer otherStop()
		h.complete(other, otherOwner, sampleResponse("other"), longTTL)
		if !closedWithin(otherCh, waitBound) {
			t.Fatalf("Watch channel of the completed key not closed within %v", waitBound)
		}
		if closedWithin(ch, quietPeriod) {
			t.Fatalf("Watch channel closed by another key's Complete")
		}
		h.complete(mine, mineOwner, sampleResponse("mine"), longTTL)
		if !closedWithin(ch, waitBound) {
			t.Fatalf("Watch channel not closed within %v of Complete", waitBound)
		}
	}},
	{"FailedEdgesDoNotWake", func(t *testing.T, h *harness) {
		// Refused calls change nothing and so notify nobody.
		key, owner := newKey(), newToken()
		h.acquireWant(req(key, owner, "fp", longLease, longTTL), idempotency.Acquired, 1)
		ch, stop := h.watch(key)
		defer stop()
		h.wantLeaseLost("Complete by another token", h.s.Complete(h.ctx(), key, newToken(), sampleResponse("x"), longTTL))
		h.wantLeaseLost("Release by another token", h.s.Release(h.ctx(), key, newToken()))
		if closedWithin(ch, quietPeriod) {
			t.Fatalf("Watch channel closed by a refused Complete or Release")
		}
		h.complete(key, owner, sampleResponse("a"), longTTL)
		if !closedWithin(ch, waitBound) {
			t.Fatalf("Watch channel not closed within %v of Complete", waitBound)
		}
	}},
	{"StopThenComplete", func(t *testing.T, h *harness) {
		key, owner := newKey(), newToken()
		h.acquireWant(req(key, owner, "fp", longLease, longTTL), idempotency.Acquired, 1)
		_, stop := h.watch(key)
		stop()
		h.complete(key, owner, sampleResponse("a"), longTTL)
		// The key can be watched again and a stopped watch leaves later
		// waiters working.
		key2, owner2 := newKey(), newToken()
		h.acquireWant(req(key2, owner2, "fp", longLease, longTTL), idempotency.Acquired, 1)
		_, stop1 := h.watch(key2)
		ch2, stop2 := h.watch(key2)
		defer stop2()
		stop1()
		if err := h.s.Release(h.ctx(), key2, owner2); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if !closedWithin(ch2, waitBound) {
			t.Fatalf("remaining Watch channel not closed within %v of Release", waitBound)
		}
		h.wantReplay(key, "fp", sampleResponse("a"))
	}},
	{"StopAfterWake", func(t *testing.T, h *harness) {
		key, owner := newKey(), newToken()
		h.acquireWant(req(key, owner, "fp", longLease, longTTL), idempotency.Acquired, 1)
		ch, stop := h.watch(key)
		h.complete(key, owner, sampleResponse("a"), longTTL)
		if !closedWithin(ch, waitBound) {
			t.Fatalf("Watch channel not closed within %v of Complete", waitBound)
		}
		stop()
	}},
	{"ManyWaiters", func(t *testing.T, h *harness) {
		const waiters = 50
		key, owner := newKey(), newToken()
		h.acquireWant(req(key, owner, "fp", longLease, longTTL), idempotency.Acquired, 1)
		var registered, done sync.WaitGroup
		var woken atomic.Int32
		registered.Add(waiters)
		done.Add(waiters)
		for range waiters {
			go func() {
				defer done.Done()
				ch, stop, err := h.s.Watch(h.ctx(), key)
				registered.Done()
				if err != nil {
					t.Errorf("Watch: %v", err)
					return
				}
				defer stop()
				if closedWithin(ch, waitBound) {
					woken.Add(1)
				}
			}()
		}
		registered.Wait()
		h.complete(key, owner, sampleResponse("a"), longTTL)
		done.Wait()
		if n := woken.Load(); n != waiters {
			t.Fatalf("%d of %d waiters woken by Complete", n, waiters)
		}
	}},
}
