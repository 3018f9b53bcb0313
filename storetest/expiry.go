package storetest

import (
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

// clockSlack absorbs the store's clock granularity (Redis: milliseconds)
// when a test checks that something did not happen too early.
const clockSlack = 5 * time.Millisecond

// expiresInSlack is how much less than the TTL left since Complete a
// replay's ExpiresIn may be: a store may round, and a cache in front of
// one counts from when it sent the call, before the store read its clock.
const expiresInSlack = time.Second

var ttlCases = []testCase{
	{"CompleteExpires", func(t *testing.T, h *harness) {
		key, owner := newKey(), newToken()
		const ttl = 150 * time.Millisecond
		h.acquireWant(req(key, owner, "fp-1", longLease, longTTL), idempotency.Acquired, 1)
		completed := time.Now()
		h.complete(key, owner, sampleResponse("a"), ttl)
		h.wantReplay(key, "fp-1", sampleResponse("a"))
		// Past its TTL the record is absent, even to another fingerprint.
		a, at := h.poll(req(key, newToken(), "fp-2", longLease, longTTL), idempotency.Acquired, idempotency.Mismatch)
		h.want(a, idempotency.Acquired, 1)
		if held := at.Sub(completed); held < ttl-clockSlack {
			t.Fatalf("COMPLETE record with TTL %v gone after %v", ttl, held)
		}
	}},
	{"CountedFromCompletion", func(t *testing.T, h *harness) {
		// The IN_PROGRESS TTL does not cap the COMPLETE record's TTL.
		key, owner := newKey(), newToken()
		const ttl = 80 * time.Millisecond
		h.acquireWant(req(key, owner, "fp", longLease, ttl), idempotency.Acquired, 1)
		start := time.Now()
		sleepUntil(start.Add(ttl))
		h.complete(key, owner, sampleResponse("a"), longTTL)
		sleepUntil(start.Add(2 * ttl))
		h.wantReplay(key, "fp", sampleResponse("a"))
	}},
	{"ExpiresIn", func(t *testing.T, h *harness) {
		// A replay asked for it tells the time left on the record's TTL, on
		// the store's clock: at most the TTL, no less than what remains of it
		// since Complete was called, and less as the store's clock moves on.
		key, owner := newKey(), newToken()
		const ttl, pause = time.Minute, 50 * time.Millisecond
		h.acquireWant(req(key, owner, "fp", longLease, longTTL), idempotency.Acquired, 1)
		completing := time.Now()
		h.complete(key, owner, sampleResponse("a"), ttl)
		replay := func() time.Duration {
			t.Helper()
			r := req(key, newToken(), "fp", longLease, longTTL)
			r.WantExpiresIn = true
			a := h.acquireWant(r, idempotency.Completed, 0)
			// The store set the TTL after completing began, and answered
			// before now.
			since := time.Since(completing)
			if least := ttl - since - expiresInSlack; a.ExpiresIn > ttl || a.ExpiresIn < least {
				t.Fatalf("ExpiresIn = %v with a TTL of %v set %v ago, want in [%v, %[2]v]", a.ExpiresIn, ttl, since, least)
			}
			return a.ExpiresIn
		}
		first := replay()
		time.Sleep(pause)
		if second := replay(); second > first-pause+clockSlack {
			t.Fatalf("ExpiresIn = %v, then %v after %v: want it to shrink as the clock moves", first, second, pause)
		}
	}},
	{"SameFingerprintAfterExpiry", func(t *testing.T, h *harness) {
		key, owner := newKey(), newToken()
		h.acquireWant(req(key, owner, "fp", longLease, longTTL), idempotency.Acquired, 1)
		h.complete(key, owner, sampleResponse("a"), 50*time.Millisecond)
		next := newToken()
		a, _ := h.poll(req(key, next, "fp", longLease, longTTL), idempotency.Acquired, idempotency.Completed)
		h.want(a, idempotency.Acquired, 1)
		h.complete(key, next, sampleResponse("b"), longTTL)
		h.wantReplay(key, "fp", sampleResponse("b"))
	}},
}

var purgeCases = []testCase{
	{"TTLShorterThanLease", func(t *testing.T, h *harness) {
		// An IN_PROGRESS record is never purged from under a live lease.
		key, owner := newKey(), newToken()
		const ttl = 50 * time.Millisecond
		h.acquireWant(req(key, owner, "fp-1", longLease, ttl), idempotency.Acquired, 1)
		start := time.Now()
		sleepUntil(start.Add(2 * ttl))
		h.acquireWant(req(key, newToken(), "fp-1", longLease, longTTL), idempotency.InFlight, 1)
		h.acquireWant(req(key, newToken(), "fp-2", longLease, longTTL), idempotency.Mismatch, 0)
		if err := h.s.Extend(h.ctx(), key, owner, longLease); err != nil {
			t.Fatalf("Extend past the TTL under a live lease: %v", err)
		}
		h.complete(key, owner, sampleResponse("owner"), longTTL)
		h.wantReplay(key, "fp-1", sampleResponse("owner"))
	}},
	{"LeaseShorterThanTTL", func(t *testing.T, h *harness) {
		// An abandoned IN_PROGRESS record outlives its lease until its TTL.
		key := newKey()
		const lease, ttl = 50 * time.Millisecond, 500 * time.Millisecond
		start := time.Now()
		h.acquireWant(req(key, newToken(), "fp-1", lease, ttl), idempotency.Acquired, 1)
		sleepUntil(time.Now().Add(lease))
		h.acquireWant(req(key, newToken(), "fp-2", longLease, longTTL), idempotency.Mismatch, 0)
		if elapsed := time.Since(start); elapsed >= ttl {
			t.Skipf("machine too slow: %v passed, the TTL is %v", elapsed, ttl)
		}
		a, at := h.poll(req(key, newToken(), "fp-2", longLease, longTTL), idempotency.Acquired, idempotency.Mismatch)
		h.want(a, idempotency.Acquired, 1)
		if held := at.Sub(start); held < ttl-clockSlack {
			t.Fatalf("IN_PROGRESS record with TTL %v purged after %v", ttl, held)
		}
	}},
	{"BothPassedSameFingerprint", func(t *testing.T, h *harness) {
		// Past TTL and lease the record is absent: a new attempt starts at
		// epoch 1 rather than stealing.
		key := newKey()
		const lease, ttl = 40 * time.Millisecond, 60 * time.Millisecond
		h.acquireWant(req(key, newToken(), "fp", lease, ttl), idempotency.Acquired, 1)
		start := time.Now()
		sleepUntil(start.Add(ttl))
		h.acquireWant(req(key, newToken(), "fp", longLease, longTTL), idempotency.Acquired, 1)
	}},
	{"RetryRenewsPastTTL", func(t *testing.T, h *harness) {
		// A lease renewed by the holder's retried Acquire keeps the record
		// past its TTL and its first lease, as an extended one does.
		key, owner := newKey(), newToken()
		const ttl = 50 * time.Millisecond
		r := req(key, owner, "fp", retryLease, ttl)
		start := time.Now()
		h.acquireWant(r, idempotency.Acquired, 1)
		sleepUntil(start.Add(retryLease / 2))
		h.acquireWant(r, idempotency.Acquired, 1)
		sleepUntil(start.Add(retryLease))
		h.acquireWant(req(key, newToken(), "fp", longLease, longTTL), idempotency.InFlight, 1)
		h.complete(key, owner, sampleResponse("owner"), longTTL)
		h.wantReplay(key, "fp", sampleResponse("owner"))
	}},
	{"ExtendPastTTL", func(t *testing.T, h *harness) {
		// An extended lease keeps the record past its TTL.
		key, owner := newKey(), newToken()
		const ttl = 60 * time.Millisecond
		h.acquireWant(req(key, owner, "fp-1", ttl, ttl), idempotency.Acquired, 1)
		start := time.Now()
		if err := h.s.Extend(h.ctx(), key, owner, longLease); err != nil {
			t.Fatalf("Extend: %v", err)
		}
		sleepUntil(start.Add(2 * ttl))
		h.acquireWant(req(key, newToken(), "fp-2", longLease, longTTL), idempotency.Mismatch, 0)
		h.acquireWant(req(key, newToken(), "fp-1", longLease, longTTL), idempotency.InFlight, 1)
		h.complete(key, owner, sampleResponse("owner"), longTTL)
	}},
}
