package redisstore_test

import (
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

// TestRoundTrips counts the commands each store operation sends: one
// EVALSHA per edge, and a replay comes back in the acquire reply.
func TestRoundTrips(t *testing.T) {
	c := newClient(t)
	counter := &commandCounter{}
	c.AddHook(counter)
	s := newStore(t, c)

	// Warm up: load the scripts (NOSCRIPT -> EVAL) and the connection.
	warm := randKey()
	mustAcquire(t, s, req(warm, "w"), idempotency.Acquired)
	if err := s.Complete(ctx, warm, "w", sampleResponse(), time.Hour); err != nil {
		t.Fatal(err)
	}
	// A payload over the maxmemory allowance goes with a script of its own.
	warmLarge := randKey()
	mustAcquire(t, s, req(warmLarge, "w"), idempotency.Acquired)
	if err := s.Complete(ctx, warmLarge, "w", largeBodyResponse(), time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, warm, "w"); err == nil {
		t.Fatal("Release of COMPLETE succeeded")
	}
	if err := s.Extend(ctx, warm, "w", time.Second); err == nil {
		t.Fatal("Extend of COMPLETE succeeded")
	}

	key := randKey()
	check := func(what string, want int64, f func()) {
		t.Helper()
		counter.reset()
		f()
		if got := counter.commands.Load(); got != want {
			t.Errorf("%s: %d commands, want %d", what, got, want)
		}
		if got := counter.roundTrips.Load(); got != want {
			t.Errorf("%s: %d round trips, want %d", what, got, want)
		}
	}
	check("first execution (acquire + complete)", 2, func() {
		mustAcquire(t, s, req(key, "t1"), idempotency.Acquired)
		if err := s.Complete(ctx, key, "t1", sampleResponse(), time.Hour); err != nil {
			t.Fatal(err)
		}
	})
	large := randKey()
	check("first execution, payload over the maxmemory allowance", 2, func() {
		mustAcquire(t, s, req(large, "t1"), idempotency.Acquired)
		if err := s.Complete(ctx, large, "t1", largeBodyResponse(), time.Hour); err != nil {
			t.Fatal(err)
		}
	})
	check("replay", 1, func() {
		a := mustAcquire(t, s, req(key, "t2"), idempotency.Completed)
		if a.Response == nil || a.Response.Status != 201 {
			t.Fatalf("replay response %+v", a.Response)
		}
	})
	other := randKey()
	mustAcquire(t, s, req(other, "t1"), idempotency.Acquired)
	check("conflict", 1, func() { mustAcquire(t, s, req(other, "t2"), idempotency.InFlight) })
	check("extend", 1, func() {
		if err := s.Extend(ctx, other, "t1", time.Second); err != nil {
			t.Fatal(err)
		}
	})
	check("release", 1, func() {
		if err := s.Release(ctx, other, "t1"); err != nil {
			t.Fatal(err)
		}
	})
}
