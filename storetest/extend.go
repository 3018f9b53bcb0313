package storetest

import (
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

var extendCases = []testCase{
	{"PushesLease", func(t *testing.T, h *harness) {
		key, owner := newKey(), newToken()
		h.acquireWant(req(key, owner, "fp", shortLease, longTTL), idempotency.Acquired, 1)
		start := time.Now()
		if err := h.s.Extend(h.ctx(), key, owner, longLease); err != nil {
			t.Fatalf("Extend by the holder: %v", err)
		}
		a := h.acquireWant(req(key, newToken(), "fp", longLease, longTTL), idempotency.InFlight, 1)
		if a.LeaseRemaining <= shortLease || a.LeaseRemaining > longLease {
			t.Fatalf("LeaseRemaining after Extend(%v) = %v, want in (%v, %v]", longLease, a.LeaseRemaining, shortLease, longLease)
		}
		// Past the original lease the record is still held.
		sleepUntil(start.Add(shortLease))
		h.acquireWant(req(key, newToken(), "fp", longLease, longTTL), idempotency.InFlight, 1)
		h.complete(key, owner, sampleResponse("owner"), longTTL)
		h.wantReplay(key, "fp", sampleResponse("owner"))
	}},
	{"Retry", func(t *testing.T, h *harness) {
		key, owner := newKey(), newToken()
		h.acquireWant(req(key, owner, "fp", longLease, longTTL), idempotency.Acquired, 1)
		for i := range 3 {
			if err := h.s.Extend(h.ctx(), key, owner, longLease); err != nil {
				t.Fatalf("Extend #%d: %v", i+1, err)
			}
		}
		h.acquireWant(req(key, newToken(), "fp", longLease, longTTL), idempotency.InFlight, 1)
	}},
	{"Absent", func(t *testing.T, h *harness) {
		key := newKey()
		h.wantLeaseLost("Extend on an absent key", h.s.Extend(h.ctx(), key, newToken(), longLease))
		h.acquireWant(req(key, newToken(), "fp", longLease, longTTL), idempotency.Acquired, 1)
	}},
	{"Complete", func(t *testing.T, h *harness) {
		key, owner := newKey(), newToken()
		h.acquireWant(req(key, owner, "fp", longLease, longTTL), idempotency.Acquired, 1)
		h.complete(key, owner, sampleResponse("a"), longTTL)
		h.wantLeaseLost("Extend of a COMPLETE record", h.s.Extend(h.ctx(), key, owner, longLease))
		h.wantReplay(key, "fp", sampleResponse("a"))
	}},
	{"OtherToken", func(t *testing.T, h *harness) {
		key, owner := newKey(), newToken()
		const lease = time.Second
		h.acquireWant(req(key, owner, "fp", lease, longTTL), idempotency.Acquired, 1)
		h.wantLeaseLost("Extend by another token", h.s.Extend(h.ctx(), key, newToken(), longTTL))
		a := h.acquireWant(req(key, newToken(), "fp", longLease, longTTL), idempotency.InFlight, 1)
		if a.LeaseRemaining > lease {
			t.Fatalf("LeaseRemaining = %v after a refused Extend, want <= %v", a.LeaseRemaining, lease)
		}
	}},
}
