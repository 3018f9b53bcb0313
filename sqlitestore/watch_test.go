package sqlitestore_test

import (
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/sqlitestore"
)

// TestTwoStoresPolling: two Stores (two *sql.DB, as two processes) on one
// file, with WithPollInterval. A waiter on one is woken when the other
// completes or releases the record, within a few poll intervals; a waiter
// whose record does not change is not.
func TestTwoStoresPolling(t *testing.T) {
	const interval = 20 * time.Millisecond
	path := newPath(t)
	a := open(t, path, sqlitestore.WithPollInterval(interval))
	b := open(t, path, sqlitestore.WithPollInterval(interval))

	for _, edge := range []string{"complete", "release"} {
		t.Run(edge, func(t *testing.T) {
			key, quiet := newKey(), newKey()
			acquire(t, a, req(key, "owner", "fp", time.Minute, time.Hour), idempotency.Acquired)
			acquire(t, a, req(quiet, "owner", "fp", time.Minute, time.Hour), idempotency.Acquired)
			acquire(t, b, req(key, "dup", "fp", time.Minute, time.Hour), idempotency.InFlight)
			changed, stop, err := b.Watch(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
			unchanged, stopQuiet, err := b.Watch(ctx, quiet)
			if err != nil {
				t.Fatal(err)
			}
			defer stopQuiet()

			start := time.Now()
			switch edge {
			case "complete":
				err = a.Complete(ctx, key, "owner", &idempotency.Response{Status: 201}, time.Hour)
			case "release":
				err = a.Release(ctx, key, "owner")
			}
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-changed:
				t.Logf("woken %v after the %s", time.Since(start).Round(time.Millisecond), edge)
			case <-time.After(50 * interval):
				t.Fatalf("the waiter on the other Store was not woken within %v of the %s", 50*interval, edge)
			}
			select {
			case <-unchanged:
				t.Fatal("the waiter of a record nobody changed was woken")
			default:
			}
			want := idempotency.Completed
			if edge == "release" {
				want = idempotency.Acquired
			}
			acquire(t, b, req(key, "dup", "fp", time.Minute, time.Hour), want)
		})
	}
}

// TestWatchInProcess: without polling, the Store's own edges wake its
// waiters, Close wakes every waiter, and Watch after Close fails.
func TestWatchInProcess(t *testing.T) {
	s, err := sqlitestore.Open(newPath(t))
	if err != nil {
		t.Fatal(err)
	}
	key := newKey()
	acquire(t, s, req(key, "owner", "fp", time.Minute, time.Hour), idempotency.Acquired)
	first, stop1, err := s.Watch(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer stop1()
	second, stop2, err := s.Watch(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	stop2()
	stop2() // more than once is fine
	if n := s.Waiters(key); n != 1 {
		t.Fatalf("%d waiters after one stopped, want 1", n)
	}
	if err := s.Complete(ctx, key, "owner", &idempotency.Response{Status: 200}, time.Hour); err != nil {
		t.Fatal(err)
	}
	select {
	case <-first:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter was not woken by Complete")
	}
	select {
	case <-second:
		t.Fatal("a stopped waiter was woken")
	default:
	}
	other, stop3, err := s.Watch(ctx, newKey())
	if err != nil {
		t.Fatal(err)
	}
	defer stop3()
	s.Close()
	select {
	case <-other:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake a waiter")
	}
	if _, _, err := s.Watch(ctx, key); err != idempotency.ErrStoreClosed {
		t.Fatalf("Watch after Close: %v, want ErrStoreClosed", err)
	}
}
