package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

var acquireCases = []testCase{
	{"Absent", func(t *testing.T, h *harness) {
		a := h.acquireWant(req(newKey(), newToken(), "fp", longLease, longTTL), idempotency.Acquired, 1)
		if a.Response != nil {
			t.Fatalf("Acquired carries a Response: %+v", a.Response)
		}
	}},
	{"InFlight", func(t *testing.T, h *harness) {
		key, owner := newKey(), newToken()
		h.acquireWant(req(key, owner, "fp", longLease, longTTL), idempotency.Acquired, 1)
		a := h.acquireWant(req(key, newToken(), "fp", longLease, longTTL), idempotency.InFlight, 1)
		if a.LeaseRemaining <= 0 || a.LeaseRemaining > longLease {
			t.Fatalf("LeaseRemaining = %v, want in (0, %v]", a.LeaseRemaining, longLease)
		}
		// The duplicate changed nothing: the owner still holds the lease.
		h.complete(key, owner, sampleResponse("owner"), longTTL)
		h.wantReplay(key, "fp", sampleResponse("owner"))
	}},
	{"Mismatch", func(t *testing.T, h *harness) {
		key, owner := newKey(), newToken()
		h.acquireWant(req(key, owner, "fp-1", longLease, longTTL), idempotency.Acquired, 1)
		h.acquireWant(req(key, newToken(), "fp-2", longLease, longTTL), idempotency.Mismatch, 0)
		// Untouched: a same-fingerprint duplicate still sees the owner's lease.
		h.acquireWant(req(key, newToken(), "fp-1", longLease, longTTL), idempotency.InFlight, 1)
		h.complete(key, owner, sampleResponse("owner"), longTTL)
		h.wantReplay(key, "fp-1", sampleResponse("owner"))
	}},
	{"SameTokenRetry", func(t *testing.T, h *harness) {
		key, owner := newKey(), newToken()
		r := req(key, owner, "fp", longLease, longTTL)
		h.acquireWant(r, idempotency.Acquired, 1)
		h.acquireWant(r, idempotency.Acquired, 1)
		h.acquireWant(r, idempotency.Acquired, 1)
		h.acquireWant(req(key, newToken(), "fp", longLease, longTTL), idempotency.InFlight, 1)
		h.complete(key, owner, sampleResponse("owner"), longTTL)
	}},
	{"SameTokenRetryRenewsLease", func(t *testing.T, h *harness) {
		// A retry by the holder renews the lease to its full length from
		// now; it never shortens it.
		key, owner := newKey(), newToken()
		const first = time.Second
		h.acquireWant(req(key, owner, "fp", first, longTTL), idempotency.Acquired, 1)
		h.acquireWant(req(key, owner, "fp", longLease, longTTL), idempotency.Acquired, 1)
		a := h.acquireWant(req(key, newToken(), "fp", longLease, longTTL), idempotency.InFlight, 1)
		if a.LeaseRemaining <= longLease-time.Second || a.LeaseRemaining > longLease {
			t.Fatalf("LeaseRemaining after a retry with lease %v = %v, want about %[1]v", longLease, a.LeaseRemaining)
		}
		h.acquireWant(req(key, owner, "fp", first, longTTL), idempotency.Acquired, 1)
		a = h.acquireWant(req(key, newToken(), "fp", longLease, longTTL), idempotency.InFlight, 1)
		if a.LeaseRemaining <= longLease-time.Second {
			t.Fatalf("LeaseRemaining after a retry with the shorter lease %v = %v: the lease of %v was shortened", first, a.LeaseRemaining, longLease)
		}
		h.complete(key, owner, sampleResponse("owner"), longTTL)
		h.wantReplay(key, "fp", sampleResponse("owner"))
	}},
	{"SameTokenRetryAfterLeaseRanOut", func(t *testing.T, h *harness) {
		// The holder's lease ran out and nobody took the record over: a
		// retry of its Acquire (as a client library sends after a timeout)
		// gets the same answer and a live lease again, so a duplicate
		// right after it cannot steal.
		key, owner := newKey(), newToken()
		r := req(key, owner, "fp", retryLease, longTTL)
		h.acquireWant(r, idempotency.Acquired, 1)
		sleepUntil(time.Now().Add(retryLease))
		h.acquireWant(r, idempotency.Acquired, 1)
		a := h.acquireWant(req(key, newToken(), "fp", longLease, longTTL), idempotency.InFlight, 1)
		if a.LeaseRemaining > retryLease {
			t.Fatalf("LeaseRemaining = %v, want at most the retried lease %v", a.LeaseRemaining, retryLease)
		}
		h.complete(key, owner, sampleResponse("owner"), longTTL)
		h.wantReplay(key, "fp", sampleResponse("owner"))
	}},
	{"OldHolderRetryAfterSteal", func(t *testing.T, h *harness) {
		// Once another token took the record over, a retry by the old
		// holder is a duplicate like any other: it takes nothing back.
		key, old := newKey(), newToken()
		r := req(key, old, "fp", shortLease, longTTL)
		h.acquireWant(r, idempotency.Acquired, 1)
		thief := req(key, newToken(), "fp", longLease, longTTL)
		a, _ := h.poll(thief, idempotency.Stolen, idempotency.InFlight)
		h.want(a, idempotency.Stolen, 2)
		a = h.acquireWant(r, idempotency.InFlight, 2)
		if a.LeaseRemaining <= shortLease {
			t.Fatalf("LeaseRemaining = %v after the old holder's retry, want the thief's lease of %v", a.LeaseRemaining, longLease)
		}
		h.wantLeaseLost("Complete by the old holder", h.s.Complete(h.ctx(), key, old, sampleResponse("old"), longTTL))
		h.acquireWant(req(key, newToken(), "fp", longLease, longTTL), idempotency.InFlight, 2)
		h.complete(key, thief.Token, sampleResponse("thief"), longTTL)
		h.wantReplay(key, "fp", sampleResponse("thief"))
		h.wantLeaseLost("Complete by the old holder after completion",
			h.s.Complete(h.ctx(), key, old, sampleResponse("old"), longTTL))
		h.wantReplay(key, "fp", sampleResponse("thief"))
	}},
	{"SameTokenOtherFingerprint", func(t *testing.T, h *harness) {
		key, owner := newKey(), newToken()
		h.acquireWant(req(key, owner, "fp-1", longLease, longTTL), idempotency.Acquired, 1)
		// Mismatch whatever the state, even for the holder's token.
		h.acquireWant(req(key, owner, "fp-2", longLease, longTTL), idempotency.Mismatch, 0)
		h.acquireWant(req(key, newToken(), "fp-1", longLease, longTTL), idempotency.InFlight, 1)
	}},
	{"KeysAreIndependent", func(t *testing.T, h *harness) {
		k1, k2 := newKey(), newKey()
		h.acquireWant(req(k1, newToken(), "fp", longLease, longTTL), idempotency.Acquired, 1)
		h.acquireWant(req(k2, newToken(), "fp", longLease, longTTL), idempotency.Acquired, 1)
	}},
}

var contextCases = []testCase{
	{"CancelledAcquire", func(t *testing.T, h *harness) {
		// A store may refuse a cancelled context or ignore it. Either way the
		// outcome is unknown to a caller that sees an error, and its retry
		// with the same token must give the first call's answer.
		key, owner := newKey(), newToken()
		r := req(key, owner, "fp", longLease, longTTL)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		a, err := h.s.Acquire(ctx, r)
		if err == nil {
			h.want(a, idempotency.Acquired, 1)
		} else {
			for _, s := range []error{idempotency.ErrLeaseLost, idempotency.ErrStoreFull, idempotency.ErrCorruptRecord} {
				if errors.Is(err, s) {
					t.Fatalf("Acquire with a cancelled context: %v, a misleading error", err)
				}
			}
		}
		h.acquireWant(r, idempotency.Acquired, 1)
		h.acquireWant(req(key, newToken(), "fp", longLease, longTTL), idempotency.InFlight, 1)
	}},
}
