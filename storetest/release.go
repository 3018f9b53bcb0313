package storetest

import (
	"testing"

	"github.com/go-idempotency/idempotency"
)

var releaseCases = []testCase{
	{"Deletes", func(t *testing.T, h *harness) {
		key, owner := newKey(), newToken()
		h.acquireWant(req(key, owner, "fp-1", longLease, longTTL), idempotency.Acquired, 1)
		if err := h.s.Release(h.ctx(), key, owner); err != nil {
			t.Fatalf("Release by the holder: %v", err)
		}
		// Absent: a fresh attempt, even with another fingerprint, starts at
		// epoch 1.
		h.acquireWant(req(key, newToken(), "fp-2", longLease, longTTL), idempotency.Acquired, 1)
	}},
	{"Retry", func(t *testing.T, h *harness) {
		key, owner := newKey(), newToken()
		h.acquireWant(req(key, owner, "fp", longLease, longTTL), idempotency.Acquired, 1)
		for i := range 3 {
			if err := h.s.Release(h.ctx(), key, owner); err != nil {
				t.Fatalf("Release #%d: %v", i+1, err)
			}
		}
		h.acquireWant(req(key, newToken(), "fp", longLease, longTTL), idempotency.Acquired, 1)
	}},
	{"Absent", func(t *testing.T, h *harness) {
		key := newKey()
		if err := h.s.Release(h.ctx(), key, newToken()); err != nil {
			t.Fatalf("Release on an absent key: %v, want nil", err)
		}
		h.acquireWant(req(key, newToken(), "fp", longLease, longTTL), idempotency.Acquired, 1)
	}},
	{"Complete", func(t *testing.T, h *harness) {
		key, owner := newKey(), newToken()
		h.acquireWant(req(key, owner, "fp", longLease, longTTL), idempotency.Acquired, 1)
		h.complete(key, owner, sampleResponse("a"), longTTL)
		h.wantLeaseLost("Release of a COMPLETE record by its completer", h.s.Release(h.ctx(), key, owner))
		h.wantLeaseLost("Release of a COMPLETE record by another token", h.s.Release(h.ctx(), key, newToken()))
		h.wantReplay(key, "fp", sampleResponse("a"))
	}},
	{"OtherToken", func(t *testing.T, h *harness) {
		key, owner := newKey(), newToken()
		h.acquireWant(req(key, owner, "fp", longLease, longTTL), idempotency.Acquired, 1)
		h.wantLeaseLost("Release by another token", h.s.Release(h.ctx(), key, newToken()))
		h.acquireWant(req(key, newToken(), "fp", longLease, longTTL), idempotency.InFlight, 1)
		h.complete(key, owner, sampleResponse("owner"), longTTL)
	}},
}
