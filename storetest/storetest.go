// Package storetest is the conformance suite for implementations of
// idempotency.Store.
//
// A Store author calls Run from an ordinary test, handing it a function that
// returns a ready store:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) idempotency.Store {
//			s := mystore.New(...)
//			t.Cleanup(func() { s.Close() })
//			return s
//		})
//	}
//
// Run checks every state and edge of the Store contract (acquire, steal,
// complete, release, extend, purge), fencing of stale owners, TTL and lease
// expiry (and the time left that a replay reports in
// Acquisition.ExpiresIn when the request asks for it), Watch
// notifications, retried calls (a retried Acquire by the holder renews its
// lease, even one that ran out, unless another token took the record over)
// and races between many goroutines.
// Each check is a named subtest, so a single one can be run with -run, for
// example
//
//	go test -run 'TestConformance/Fencing/StaleOwner' ./mystore
//
// Run calls newStore once per subtest, with that subtest's *testing.T, and
// most subtests run in parallel. newStore may return the same store, or
// stores sharing one backend, every time: each subtest works on its own
// random keys (64 hex digits, like the hashes the middleware derives), so
// subtests never see each other's records. A store backed by a shared server
// therefore needs no cleanup between subtests beyond the expiry of its
// records.
//
// The suite cannot control a store's clock (a Redis store uses the server's
// TIME), so expiry checks use short real leases and TTLs (tens to hundreds of
// milliseconds) and poll with a deadline. The whole suite takes a few
// seconds.
//
// Context handling is not required: Acquire with an already cancelled
// context may fail or may succeed, but either way a retry with the same token
// and a live context must give the answer the first call would have given.
//
// Responses are compared by value: Status, BodyOmitted, HeaderOmitted, the
// body's bytes and every header value in order. A nil and an empty Header
// (or Body) are treated as equal, since a store that serialises records
// cannot tell them apart.
package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

// Durations used where expiry must not happen during a subtest.
const (
	longLease = 10 * time.Second
	longTTL   = time.Hour
	// shortLease is a lease a subtest waits out in real time.
	shortLease = 60 * time.Millisecond
	// retryLease is a lease a subtest waits out before the holder retries
	// its Acquire: the duplicate that follows the retry must find the
	// renewed lease still running, on a busy machine too.
	retryLease = 300 * time.Millisecond
	// waitBound bounds every wait for something that must happen.
	waitBound = 3 * time.Second
)

// Run runs the Store conformance suite against the stores returned by
// newStore. See the package documentation for how subtests use them.
func Run(t *testing.T, newStore func(t *testing.T) idempotency.Store) {
	t.Helper()
	groups := []struct {
		name  string
		cases []testCase
	}{
		{"Acquire", acquireCases},
		{"Complete", completeCases},
		{"Payload", payloadCases},
		{"Release", releaseCases},
		{"Extend", extendCases},
		{"Steal", stealCases},
		{"Fencing", fencingCases},
		{"TTL", ttlCases},
		{"Purge", purgeCases},
		{"Watch", watchCases},
		{"Concurrency", concurrencyCases},
		{"Context", contextCases},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			for _, c := range g.cases {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					c.fn(t, &harness{t: t, s: newStore(t)})
				})
			}
		})
	}
}

type testCase struct {
	name string
	fn   func(t *testing.T, h *harness)
}

// harness wraps a store with assertions that fail the subtest.
type harness struct {
	t *testing.T
	s idempotency.Store
}

// newKey returns a random storage key of 64 hex digits.
func newKey() string {
	var b [32]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// newToken returns a random lease token.
func newToken() string {
	var b [16]byte
	rand.Read(b[:])
	return "t-" + hex.EncodeToString(b[:])
}

func (h *harness) ctx() context.Context { return context.Background() }

func req(key, token, fp string, lease, ttl time.Duration) idempotency.AcquireRequest {
	return idempotency.AcquireRequest{Key: key, Token: token, Fingerprint: fp, Lease: lease, TTL: ttl}
}

// acquire calls Acquire and fails the subtest on error.
func (h *harness) acquire(r idempotency.AcquireRequest) idempotency.Acquisition {
	h.t.Helper()
	a, err := h.s.Acquire(h.ctx(), r)
	if err != nil {
		h.t.Fatalf("Acquire(token %s, fp %q): unexpected error %v", r.Token, r.Fingerprint, err)
	}
	if r.WantExpiresIn && a.Outcome == idempotency.Completed && a.ExpiresIn == 0 {
		h.t.Fatalf("Acquire completed with WantExpiresIn: ExpiresIn = 0, want the record's time left")
	}
	return a
}

// want checks an acquisition's outcome and, when epoch is not 0, its epoch.
func (h *harness) want(a idempotency.Acquisition, o idempotency.AcquireOutcome, epoch uint64) {
	h.t.Helper()
	if a.Outcome != o {
		h.t.Fatalf("Acquire outcome = %v, want %v (acquisition %+v)", a.Outcome, o, a)
	}
	if epoch != 0 && a.Epoch != epoch {
		h.t.Fatalf("Acquire (%v) epoch = %d, want %d", a.Outcome, a.Epoch, epoch)
	}
	switch o {
	case idempotency.Completed:
		if a.Response == nil {
			h.t.Fatalf("Acquire outcome completed with a nil Response")
		}
		// Every Complete of the suite keeps its record for longTTL at most.
		// A store may tell the time left unasked; 0 says it does not.
		if a.ExpiresIn != 0 && (a.ExpiresIn < time.Millisecond || a.ExpiresIn > longTTL) {
			h.t.Fatalf("Acquire completed ExpiresIn = %v, want 0 or in [1ms, %v]", a.ExpiresIn, longTTL)
		}
	case idempotency.InFlight:
		if a.LeaseRemaining < time.Millisecond {
			h.t.Fatalf("Acquire in_flight LeaseRemaining = %v, want >= 1ms", a.LeaseRemaining)
		}
	}
}

// acquireWant is acquire followed by want.
func (h *harness) acquireWant(r idempotency.AcquireRequest, o idempotency.AcquireOutcome, epoch uint64) idempotency.Acquisition {
	h.t.Helper()
	a := h.acquire(r)
	h.want(a, o, epoch)
	return a
}

func (h *harness) complete(key, token string, resp *idempotency.Response, ttl time.Duration) {
	h.t.Helper()
	if err := h.s.Complete(h.ctx(), key, token, resp, ttl); err != nil {
		h.t.Fatalf("Complete(token %s): %v", token, err)
	}
}

// wantLeaseLost checks that err is ErrLeaseLost.
func (h *harness) wantLeaseLost(op string, err error) {
	h.t.Helper()
	if !errors.Is(err, idempotency.ErrLeaseLost) {
		h.t.Fatalf("%s: error %v, want idempotency.ErrLeaseLost", op, err)
	}
}

// wantReplay checks that the record at key replays want to a newcomer with
// fingerprint fp.
func (h *harness) wantReplay(key, fp string, want *idempotency.Response) {
	h.t.Helper()
	a := h.acquireWant(req(key, newToken(), fp, longLease, longTTL), idempotency.Completed, 0)
	if d := diffResponse(a.Response, want); d != "" {
		h.t.Fatalf("replayed response differs: %s", d)
	}
}

// poll calls Acquire with r until its outcome is want, failing the subtest
// on any outcome not in before or when waitBound passes. It returns the
// acquisition and the time the call that saw want returned: the store
// observed want no later than that.
func (h *harness) poll(r idempotency.AcquireRequest, want idempotency.AcquireOutcome, before ...idempotency.AcquireOutcome) (idempotency.Acquisition, time.Time) {
	h.t.Helper()
	deadline := time.Now().Add(waitBound)
	for {
		a := h.acquire(r)
		if a.Outcome == want {
			return a, time.Now()
		}
		if !slices.Contains(before, a.Outcome) {
			h.t.Fatalf("while waiting for %v: Acquire outcome %v (acquisition %+v)", want, a.Outcome, a)
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("Acquire outcome still %v after %v, want %v", a.Outcome, waitBound, want)
		}
		pause := 5 * time.Millisecond
		if a.Outcome == idempotency.InFlight && a.LeaseRemaining < pause {
			pause = a.LeaseRemaining
		}
		time.Sleep(pause)
	}
}

// sleepUntil sleeps until t, plus a small margin for clock granularity. To
// wait out a lease or TTL, t counts from when the call that set it returned.
func sleepUntil(t time.Time) {
	time.Sleep(time.Until(t) + 15*time.Millisecond)
}

// closedWithin reports whether ch is closed within d.
func closedWithin(ch <-chan struct{}, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ch:
		return true
	case <-timer.C:
		return false
	}
}

// diffResponse describes how got differs from want, or returns "".
func diffResponse(got, want *idempotency.Response) string {
	if got == nil || want == nil {
		if got == want {
			return ""
		}
		return fmt.Sprintf("got %v, want %v", got, want)
	}
	if got.Status != want.Status {
		return fmt.Sprintf("Status = %d, want %d", got.Status, want.Status)
	}
	if got.BodyOmitted != want.BodyOmitted {
		return fmt.Sprintf("BodyOmitted = %v, want %v", got.BodyOmitted, want.BodyOmitted)
	}
	if got.HeaderOmitted != want.HeaderOmitted {
		return fmt.Sprintf("HeaderOmitted = %v, want %v", got.HeaderOmitted, want.HeaderOmitted)
	}
	if !bytes.Equal(got.Body, want.Body) {
		return fmt.Sprintf("Body (%d bytes) differs from the stored body (%d bytes)", len(got.Body), len(want.Body))
	}
	if d := diffHeader(got.Header, want.Header); d != "" {
		return "Header " + d
	}
	return ""
}

func diffHeader(got, want http.Header) string {
	keys := func(h http.Header) []string {
		var ks []string
		for k := range h {
			ks = append(ks, k)
		}
		sort.Strings(ks)
		return ks
	}
	if !slices.Equal(keys(got), keys(want)) {
		return fmt.Sprintf("names %q, want %q", keys(got), keys(want))
	}
	for k, w := range want {
		if !slices.Equal(got[k], w) {
			return fmt.Sprintf("%s = %q, want %q", k, got[k], w)
		}
	}
	return ""
}

// cloneResponse returns a deep copy of r, so a test can compare against the
// original after handing the copy to the store.
func cloneResponse(r *idempotency.Response) *idempotency.Response {
	c := *r
	c.Header = r.Header.Clone()
	if r.Body != nil {
		c.Body = bytes.Clone(r.Body)
	}
	return &c
}

// sampleResponse returns a typical response whose body names tag.
func sampleResponse(tag string) *idempotency.Response {
	return &idempotency.Response{
		Status: http.StatusCreated,
		Header: http.Header{
			"Content-Type": {"application/json"},
			"Location":     {"/payments/" + tag},
			"X-Multi":      {"b", "a", "c"},
		},
		Body: []byte(`{"id":"` + tag + `"}`),
	}
}
