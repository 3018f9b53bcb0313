package replaycache_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/replaycache"
)

// waitFor polls cond until it holds, failing t after 10 seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// result is one caller's answer.
type result struct {
	req idempotency.AcquireRequest
	a   idempotency.Acquisition
	err error
}

// storm sends the first request to c, waits until it reaches the store
// (held at its gate), sends the others, waits until they all wait for the
// first one's call, then opens the gate. It returns every answer, the
// first one's first.
func storm(t *testing.T, c *replaycache.Cache, s *stub, first idempotency.AcquireRequest, others []idempotency.AcquireRequest) []result {
	t.Helper()
	results := make([]result, 1+len(others))
	var wg sync.WaitGroup
	send := func(i int, r idempotency.AcquireRequest) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, err := c.Acquire(context.Background(), r)
			results[i] = result{r, a, err}
		}()
	}
	send(0, first)
	select {
	case <-s.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first request never reached the store")
	}
	for i, r := range others {
		send(i+1, r)
	}
	waitFor(t, "the others to wait for the first call", func() bool { return c.Waiters(first.Key) == len(others) })
	close(s.gate)
	wg.Wait()
	return results
}

// TestConcurrentMissesShareACompletedRecord: callers that miss one key
// together cost the store one call when it finds the record COMPLETE;
// those with another fingerprint are told Mismatch.
func TestConcurrentMissesShareACompletedRecord(t *testing.T) {
	t.Parallel()
	const n = 64
	want := response("a")
	s := newStub(func(req idempotency.AcquireRequest) (idempotency.Acquisition, error) {
		if req.Fingerprint != "fp" {
			return idempotency.Acquisition{Outcome: idempotency.Mismatch}, nil
		}
		return idempotency.Acquisition{Outcome: idempotency.Completed, Response: want, ExpiresIn: time.Hour}, nil
	})
	s.gate = make(chan struct{})
	c := replaycache.New(s)
	var others []idempotency.AcquireRequest
	for i := 1; i < n; i++ {
		fp := "fp"
		if i%4 == 0 {
			fp = "other"
		}
		others = append(others, request("k", fmt.Sprint("t", i), fp))
	}
	for _, r := range storm(t, c, s, request("k", "t0", "fp"), others) {
		if r.err != nil {
			t.Fatalf("%s: %v", r.req.Token, r.err)
		}
		if r.req.Fingerprint == "fp" {
			wantReplay(t, r.a, want)
		} else if r.a.Outcome != idempotency.Mismatch {
			t.Fatalf("%s with another fingerprint: %+v, want mismatch", r.req.Token, r.a)
		}
	}
	if got := len(s.requests()); got != 1 {
		t.Fatalf("store Acquires = %d for %d concurrent duplicates, want 1", got, n)
	}
	if st := c.Stats(); st.Shared != n-1 || st.Misses != 1 {
		t.Fatalf("Stats = %+v, want %d shared, 1 miss", st, n-1)
	}
}

// TestConcurrentMissesShareAMismatchOfTheirFingerprint: a Mismatch answers
// the waiters with the same fingerprint; the others ask the store.
func TestConcurrentMissesShareAMismatchOfTheirFingerprint(t *testing.T) {
	t.Parallel()
	s := newStub(func(req idempotency.AcquireRequest) (idempotency.Acquisition, error) {
		if req.Fingerprint == "fp" {
			return idempotency.Acquisition{Outcome: idempotency.InFlight, Epoch: 1, LeaseRemaining: time.Second}, nil
		}
		return idempotency.Acquisition{Outcome: idempotency.Mismatch}, nil
	})
	s.gate = make(chan struct{})
	c := replaycache.New(s)
	others := []idempotency.AcquireRequest{
		request("k", "t1", "other"), request("k", "t2", "other"), request("k", "t3", "fp"), request("k", "t4", "fp"),
	}
	for _, r := range storm(t, c, s, request("k", "t0", "other"), others) {
		want := idempotency.Mismatch
		if r.req.Fingerprint == "fp" {
			want = idempotency.InFlight
		}
		if r.err != nil || r.a.Outcome != want {
			t.Fatalf("%s: %+v, %v, want %v", r.req.Token, r.a, r.err, want)
		}
	}
	var tokens []string
	for _, r := range s.requests() {
		tokens = append(tokens, r.Token)
	}
	if len(tokens) != 3 || tokens[0] != "t0" {
		t.Fatalf("store calls by %v, want t0 then t3 and t4 (their own)", tokens)
	}
}

// TestAcquiredIsNotShared: when the first caller takes the lease, every
// waiter asks the store on its own, with its own token, and none of them
// is told it holds the lease.
func TestAcquiredIsNotShared(t *testing.T) {
	t.Parallel()
	const n = 32
	for _, tc := range []struct {
		name  string
		first func() (idempotency.Acquisition, error)
	}{
		{"Acquired", func() (idempotency.Acquisition, error) {
			return idempotency.Acquisition{Outcome: idempotency.Acquired, Epoch: 1}, nil
		}},
		{"Stolen", func() (idempotency.Acquisition, error) {
			return idempotency.Acquisition{Outcome: idempotency.Stolen, Epoch: 2}, nil
		}},
		{"InFlight", func() (idempotency.Acquisition, error) {
			return idempotency.Acquisition{Outcome: idempotency.InFlight, Epoch: 1, LeaseRemaining: time.Second}, nil
		}},
		{"Error", func() (idempotency.Acquisition, error) { return idempotency.Acquisition{}, errors.New("unreachable") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newStub(func(req idempotency.AcquireRequest) (idempotency.Acquisition, error) {
				if req.Token == "t0" {
					return tc.first()
				}
				return idempotency.Acquisition{Outcome: idempotency.InFlight, Epoch: 1, LeaseRemaining: time.Second}, nil
			})
			s.gate = make(chan struct{})
			c := replaycache.New(s)
			var others []idempotency.AcquireRequest
			for i := 1; i < n; i++ {
				others = append(others, request("k", fmt.Sprint("t", i), "fp"))
			}
			results := storm(t, c, s, request("k", "t0", "fp"), others)
			want, wantErr := tc.first()
			if results[0].a != want || (results[0].err == nil) != (wantErr == nil) {
				t.Fatalf("first caller: %+v, %v, want the store's %+v, %v", results[0].a, results[0].err, want, wantErr)
			}
			for _, r := range results[1:] {
				if r.err != nil || r.a.Outcome != idempotency.InFlight {
					t.Fatalf("%s: %+v, %v, want its own in_flight", r.req.Token, r.a, r.err)
				}
			}
			tokens := map[string]bool{}
			for _, r := range s.requests() {
				tokens[r.Token] = true
			}
			if len(tokens) != n || len(s.requests()) != n {
				t.Fatalf("store calls by %d tokens (%d calls), want each of the %d callers once", len(tokens), len(s.requests()), n)
			}
			if st := c.Stats(); st.Shared != 0 || st.Misses != n {
				t.Fatalf("Stats = %+v, want nothing shared, %d misses", st, n)
			}
		})
	}
}

// TestWaiterContextEnds: a waiter whose context ends stops waiting for
// another caller's store call.
func TestWaiterContextEnds(t *testing.T) {
	t.Parallel()
	s := newStub(completed(response("a"), time.Hour))
	s.gate = make(chan struct{})
	c := replaycache.New(s)
	first := make(chan error, 1)
	go func() {
		_, err := c.Acquire(context.Background(), request("k", "t0", "fp"))
		first <- err
	}()
	<-s.entered
	ctx, cancel := context.WithCancel(context.Background())
	waiter := make(chan error, 1)
	go func() {
		_, err := c.Acquire(ctx, request("k", "t1", "fp"))
		waiter <- err
	}()
	waitFor(t, "the waiter to join", func() bool { return c.Waiters("k") == 1 })
	cancel()
	select {
	case err := <-waiter:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("waiter: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter kept waiting after its context ended")
	}
	select {
	case err := <-first:
		t.Fatalf("the first call returned (%v) before its store call did", err)
	default:
	}
	close(s.gate)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if n := len(s.requests()); n != 1 {
		t.Fatalf("store Acquires = %d, want 1: the waiter made none", n)
	}
}
