package storetest

import (
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

var stealCases = []testCase{
	{"ExpiredLease", func(t *testing.T, h *harness) {
		key := newKey()
		h.acquireWant(req(key, newToken(), "fp", shortLease, longTTL), idempotency.Acquired, 1)

		second := req(key, newToken(), "fp", shortLease, longTTL)
		a, _ := h.poll(second, idempotency.Stolen, idempotency.InFlight)
		h.want(a, idempotency.Stolen, 2)
		// A retried steal by the same token reports the same answer.
		h.acquireWant(second, idempotency.Stolen, 2)

		third := req(key, newToken(), "fp", longLease, longTTL)
		a, _ = h.poll(third, idempotency.Stolen, idempotency.InFlight)
		h.want(a, idempotency.Stolen, 3)
		a = h.acquireWant(req(key, newToken(), "fp", longLease, longTTL), idempotency.InFlight, 3)
		if a.LeaseRemaining <= shortLease {
			t.Fatalf("LeaseRemaining after a steal with lease %v = %v", longLease, a.LeaseRemaining)
		}
		h.complete(key, third.Token, sampleResponse("third"), longTTL)
		h.wantReplay(key, "fp", sampleResponse("third"))
	}},
	{"RetryAfterLeaseRanOut", func(t *testing.T, h *harness) {
		// A thief whose own lease ran out retries its Acquire: it keeps
		// the record at the same epoch, with a live lease again.
		key := newKey()
		h.acquireWant(req(key, newToken(), "fp", shortLease, longTTL), idempotency.Acquired, 1)
		thief := req(key, newToken(), "fp", retryLease, longTTL)
		a, _ := h.poll(thief, idempotency.Stolen, idempotency.InFlight)
		h.want(a, idempotency.Stolen, 2)
		sleepUntil(time.Now().Add(retryLease))
		h.acquireWant(thief, idempotency.Stolen, 2)
		h.acquireWant(req(key, newToken(), "fp", longLease, longTTL), idempotency.InFlight, 2)
		h.complete(key, thief.Token, sampleResponse("thief"), longTTL)
		h.wantReplay(key, "fp", sampleResponse("thief"))
	}},
	{"LiveLease", func(t *testing.T, h *harness) {
		key := newKey()
		h.acquireWant(req(key, newToken(), "fp", time.Second, longTTL), idempotency.Acquired, 1)
		for range 5 {
			h.acquireWant(req(key, newToken(), "fp", time.Second, longTTL), idempotency.InFlight, 1)
		}
	}},
	{"DifferentFingerprint", func(t *testing.T, h *harness) {
		// An expired lease under another fingerprint is a mismatch, not a
		// record to take over.
		key := newKey()
		h.acquireWant(req(key, newToken(), "fp-1", shortLease, longTTL), idempotency.Acquired, 1)
		start := time.Now()
		sleepUntil(start.Add(shortLease))
		h.acquireWant(req(key, newToken(), "fp-2", longLease, longTTL), idempotency.Mismatch, 0)
		h.acquireWant(req(key, newToken(), "fp-2", longLease, longTTL), idempotency.Mismatch, 0)
		// Untouched: the matching fingerprint can still steal it.
		a, _ := h.poll(req(key, newToken(), "fp-1", longLease, longTTL), idempotency.Stolen, idempotency.InFlight)
		h.want(a, idempotency.Stolen, 2)
	}},
}

var fencingCases = []testCase{
	{"StaleOwner", func(t *testing.T, h *harness) {
		key, stale := newKey(), newToken()
		h.acquireWant(req(key, stale, "fp", shortLease, longTTL), idempotency.Acquired, 1)
		owner := req(key, newToken(), "fp", longLease, longTTL)
		a, _ := h.poll(owner, idempotency.Stolen, idempotency.InFlight)
		h.want(a, idempotency.Stolen, 2)

		h.wantLeaseLost("Complete by the stale owner", h.s.Complete(h.ctx(), key, stale, sampleResponse("stale"), longTTL))
		h.wantLeaseLost("Extend by the stale owner", h.s.Extend(h.ctx(), key, stale, longLease))
		h.wantLeaseLost("Release by the stale owner", h.s.Release(h.ctx(), key, stale))
		// Nothing was overwritten: the new owner's record is IN_PROGRESS.
		a = h.acquireWant(req(key, newToken(), "fp", longLease, longTTL), idempotency.InFlight, 2)
		if a.LeaseRemaining <= shortLease {
			t.Fatalf("LeaseRemaining = %v: the stale owner's Extend changed the lease?", a.LeaseRemaining)
		}
		// The stale owner cannot take its lease back by acquiring again.
		h.acquireWant(req(key, stale, "fp", longLease, longTTL), idempotency.InFlight, 2)

		h.complete(key, owner.Token, sampleResponse("owner"), longTTL)
		h.wantReplay(key, "fp", sampleResponse("owner"))
		h.wantLeaseLost("Complete by the stale owner after completion",
			h.s.Complete(h.ctx(), key, stale, sampleResponse("stale"), longTTL))
		h.wantLeaseLost("Release by the stale owner after completion", h.s.Release(h.ctx(), key, stale))
		h.wantReplay(key, "fp", sampleResponse("owner"))
	}},
	{"StaleOwnerAfterRelease", func(t *testing.T, h *harness) {
		// The new owner releases; the stale owner's late Complete must not
		// resurrect the record.
		key, stale := newKey(), newToken()
		h.acquireWant(req(key, stale, "fp", shortLease, longTTL), idempotency.Acquired, 1)
		owner := req(key, newToken(), "fp", longLease, longTTL)
		h.poll(owner, idempotency.Stolen, idempotency.InFlight)
		if err := h.s.Release(h.ctx(), key, owner.Token); err != nil {
			t.Fatalf("Release by the new owner: %v", err)
		}
		h.wantLeaseLost("Complete by the stale owner after release",
			h.s.Complete(h.ctx(), key, stale, sampleResponse("stale"), longTTL))
		h.acquireWant(req(key, newToken(), "fp", longLease, longTTL), idempotency.Acquired, 1)
	}},
	{"ExpiredLeaseNotStolen", func(t *testing.T, h *harness) {
		// Only Acquire judges expiry: a holder whose lease ran out but was
		// not taken over may still complete.
		key, owner := newKey(), newToken()
		h.acquireWant(req(key, owner, "fp", shortLease, longTTL), idempotency.Acquired, 1)
		start := time.Now()
		sleepUntil(start.Add(shortLease))
		h.complete(key, owner, sampleResponse("late"), longTTL)
		h.wantReplay(key, "fp", sampleResponse("late"))
	}},
}
