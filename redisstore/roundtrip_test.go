package redisstore_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/redisstore"
)

// TestRoundTrips counts the commands each store operation sends: one
// EVALSHA per edge, and a replay comes back in the acquire reply.
func TestRoundTrips(t *testing.T) {
	c := hookedClient(t, redistest.Addr(t))
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
	roundTrips := func(what string, want int64, f func()) {
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
	roundTrips("first execution (acquire + complete)", 2, func() {
		mustAcquire(t, s, req(key, "t1"), idempotency.Acquired)
		if err := s.Complete(ctx, key, "t1", sampleResponse(), time.Hour); err != nil {
			t.Fatal(err)
		}
	})
	large := randKey()
	roundTrips("first execution, payload over the maxmemory allowance", 2, func() {
		mustAcquire(t, s, req(large, "t1"), idempotency.Acquired)
		if err := s.Complete(ctx, large, "t1", largeBodyResponse(), time.Hour); err != nil {
			t.Fatal(err)
		}
	})
	roundTrips("replay", 1, func() {
		a := mustAcquire(t, s, req(key, "t2"), idempotency.Completed)
		if a.Response == nil || a.Response.Status != 201 {
			t.Fatalf("replay response %+v", a.Response)
		}
	})
	other := randKey()
	mustAcquire(t, s, req(other, "t1"), idempotency.Acquired)
	roundTrips("conflict", 1, func() { mustAcquire(t, s, req(other, "t2"), idempotency.InFlight) })
	roundTrips("extend", 1, func() {
		if err := s.Extend(ctx, other, "t1", time.Second); err != nil {
			t.Fatal(err)
		}
	})
	roundTrips("release", 1, func() {
		if err := s.Release(ctx, other, "t1"); err != nil {
			t.Fatal(err)
		}
	})
}

// TestNewSendsNothing: New and Close send no command, so creating a Store
// neither waits for the server nor needs any permission beyond the
// scripts'.
func TestNewSendsNothing(t *testing.T) {
	c := hookedClient(t, redistest.Addr(t))
	counter := &commandCounter{}
	c.AddHook(counter)
	s := redisstore.New(c, redisstore.WithPrefix(redistest.Prefix()))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if n := counter.commands.Load(); n != 0 {
		t.Errorf("New and Close sent %d commands: %v", n, counter.sent())
	}
}

// TestUserWithoutServerCommands: a user that may not run INFO, CONFIG or
// CLIENT, as managed services and restricted ACLs have it, runs every
// edge.
func TestUserWithoutServerCommands(t *testing.T) {
	srv := redistest.Start(t)
	if _, err := redistest.Do(srv.Addr(), "ACL", "SETUSER", "app", "on", ">secret", "~*", "&*", "+@all", "-info", "-config", "-client"); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "app", Password: "secret"})
	t.Cleanup(func() { c.Close() })
	if err := c.Info(ctx).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("INFO as the restricted user: %v, want NOPERM", err)
	}
	s := newStore(t, c)
	key := randKey()
	mustAcquire(t, s, req(key, "t"), idempotency.Acquired)
	if err := s.Extend(ctx, key, "t", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, key, "t", sampleResponse(), time.Hour); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, s, req(key, "t2"), idempotency.Completed)
	other := randKey()
	mustAcquire(t, s, req(other, "t"), idempotency.Acquired)
	if err := s.Release(ctx, other, "t"); err != nil {
		t.Fatal(err)
	}
}
