package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/fakeclock"
	"github.com/go-idempotency/idempotency/memstore"
	"github.com/go-idempotency/idempotency/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) idempotency.Store {
		s := memstore.New()
		t.Cleanup(func() { s.Close() })
		return s
	})
}

// newStore returns a store on a fake clock, closed when the test ends.
func newStore(t *testing.T, opts ...memstore.Option) (*memstore.Store, *fakeclock.Clock) {
	t.Helper()
	clock := fakeclock.New(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	s := memstore.New(append([]memstore.Option{memstore.WithClock(clock.Now)}, opts...)...)
	t.Cleanup(func() { s.Close() })
	return s, clock
}

func acquire(t *testing.T, s *memstore.Store, key, token, fp string, lease, ttl time.Duration) idempotency.Acquisition {
	t.Helper()
	a, err := s.Acquire(context.Background(), idempotency.AcquireRequest{
		Key: key, Token: token, Fingerprint: fp, Lease: lease, TTL: ttl,
	})
	if err != nil {
		t.Fatalf("Acquire(%s, %s): %v", key, token, err)
	}
	return a
}

func wantOutcome(t *testing.T, a idempotency.Acquisition, o idempotency.AcquireOutcome, epoch uint64) {
	t.Helper()
	if a.Outcome != o || a.Epoch != epoch {
		t.Fatalf("acquisition %+v, want outcome %v epoch %d", a, o, epoch)
	}
}

var okResponse = &idempotency.Response{Status: http.StatusOK, Body: []byte("ok")}

// replays reports whether a replays want: the store keeps a response in
// its own form, so a replay is an equal Response, not the same one.
func replays(a idempotency.Acquisition, want *idempotency.Response) bool {
	return a.Outcome == idempotency.Completed && a.Response != nil && reflect.DeepEqual(*a.Response, *want)
}

func TestExpiryOnFakeClock(t *testing.T) {
	t.Parallel()
	s, clock := newStore(t)
	ctx := context.Background()

	wantOutcome(t, acquire(t, s, "k", "a", "fp", 10*time.Second, time.Minute), idempotency.Acquired, 1)
	clock.Advance(9 * time.Second)
	a := acquire(t, s, "k", "b", "fp", 10*time.Second, time.Minute)
	wantOutcome(t, a, idempotency.InFlight, 1)
	if a.LeaseRemaining != time.Second {
		t.Fatalf("LeaseRemaining = %v, want 1s", a.LeaseRemaining)
	}
	clock.Advance(time.Second - time.Microsecond)
	a = acquire(t, s, "k", "b", "fp", 10*time.Second, time.Minute)
	if a.Outcome != idempotency.InFlight || a.LeaseRemaining != time.Millisecond {
		t.Fatalf("1µs before expiry: %+v, want in_flight with the 1ms floor", a)
	}
	clock.Advance(time.Microsecond) // the lease ends now
	wantOutcome(t, acquire(t, s, "k", "b", "fp", 10*time.Second, time.Minute), idempotency.Stolen, 2)

	if err := s.Complete(ctx, "k", "b", okResponse, time.Hour); err != nil {
		t.Fatal(err)
	}
	// A replay tells the time left on the record's TTL, to the nanosecond
	// on this clock, with the 1ms floor at the end.
	if a = acquire(t, s, "k", "c", "fp", time.Second, time.Minute); a.ExpiresIn != time.Hour {
		t.Fatalf("right after Complete: ExpiresIn = %v, want 1h", a.ExpiresIn)
	}
	clock.Advance(time.Minute)
	if a = acquire(t, s, "k", "c", "fp", time.Second, time.Minute); a.ExpiresIn != time.Hour-time.Minute {
		t.Fatalf("a minute after Complete: ExpiresIn = %v, want 59m", a.ExpiresIn)
	}
	clock.Advance(time.Hour - time.Minute - time.Nanosecond)
	wantOutcome(t, acquire(t, s, "k", "c", "other", time.Second, time.Minute), idempotency.Mismatch, 0)
	a = acquire(t, s, "k", "c", "fp", time.Second, time.Minute)
	if !replays(a, okResponse) || a.ExpiresIn != time.Millisecond {
		t.Fatalf("before the TTL: %+v, want the stored response with the 1ms floor", a)
	}
	clock.Advance(time.Nanosecond)
	wantOutcome(t, acquire(t, s, "k", "c", "other", time.Second, time.Minute), idempotency.Acquired, 1)
	if n := s.Len(); n != 1 {
		t.Fatalf("Len = %d, want 1 (the expired record is reused in place)", n)
	}
}

func TestExpiredRecordIsAbsentToHolder(t *testing.T) {
	t.Parallel()
	s, clock := newStore(t, memstore.WithSweepInterval(time.Hour))
	ctx := context.Background()
	wantOutcome(t, acquire(t, s, "k", "a", "fp", time.Second, 2*time.Second), idempotency.Acquired, 1)
	wantOutcome(t, acquire(t, s, "j", "a", "fp", time.Second, 2*time.Second), idempotency.Acquired, 1)
	clock.Advance(time.Second)
	// Lease over, TTL not: still the holder's record.
	if err := s.Extend(ctx, "k", "a", time.Second); err != nil {
		t.Fatalf("Extend after the lease, before the TTL: %v", err)
	}
	clock.Advance(time.Second)
	// k: lease and TTL both end now. j: expired a second ago.
	for _, key := range []string{"k", "j"} {
		if err := s.Complete(ctx, key, "a", okResponse, time.Hour); !errors.Is(err, idempotency.ErrLeaseLost) {
			t.Fatalf("Complete of expired %s: %v, want ErrLeaseLost", key, err)
		}
		if err := s.Extend(ctx, key, "a", time.Hour); !errors.Is(err, idempotency.ErrLeaseLost) {
			t.Fatalf("Extend of expired %s: %v, want ErrLeaseLost", key, err)
		}
		if err := s.Release(ctx, key, "a"); err != nil {
			t.Fatalf("Release of expired %s: %v, want nil", key, err)
		}
		wantOutcome(t, acquire(t, s, key, "b", "other", time.Second, time.Second), idempotency.Acquired, 1)
	}
}

func TestHolderRetryPushesLease(t *testing.T) {
	t.Parallel()
	s, clock := newStore(t)
	wantOutcome(t, acquire(t, s, "k", "a", "fp", 10*time.Second, time.Minute), idempotency.Acquired, 1)
	clock.Advance(5 * time.Second)
	wantOutcome(t, acquire(t, s, "k", "a", "fp", 10*time.Second, time.Minute), idempotency.Acquired, 1)
	a := acquire(t, s, "k", "b", "fp", 10*time.Second, time.Minute)
	if a.Outcome != idempotency.InFlight || a.LeaseRemaining != 10*time.Second {
		t.Fatalf("after the holder's retry: %+v, want in_flight with 10s left", a)
	}
	// A retry never shortens the lease.
	wantOutcome(t, acquire(t, s, "k", "a", "fp", time.Second, time.Minute), idempotency.Acquired, 1)
	if a := acquire(t, s, "k", "b", "fp", 10*time.Second, time.Minute); a.LeaseRemaining != 10*time.Second {
		t.Fatalf("LeaseRemaining = %v after a retry with a shorter lease, want 10s", a.LeaseRemaining)
	}
}

// fill creates IN_PROGRESS records k0..k(n-1) held by token "t".
func fill(t *testing.T, s *memstore.Store, n int, lease, ttl time.Duration) {
	t.Helper()
	for i := range n {
		wantOutcome(t, acquire(t, s, fmt.Sprint("k", i), "t", "fp", lease, ttl), idempotency.Acquired, 1)
	}
}

func TestSweepPurgesExpired(t *testing.T) {
	t.Parallel()
	s, clock := newStore(t, memstore.WithSweepInterval(time.Hour))
	ctx := context.Background()
	// k0..k9: COMPLETE for 1m. k10..k19: abandoned, lease 10s, TTL 1m.
	// k20..k29: running, lease 2h, TTL 1m.
	for i := range 30 {
		lease := 10 * time.Second
		if i >= 20 {
			lease = 2 * time.Hour
		}
		key := fmt.Sprint("k", i)
		wantOutcome(t, acquire(t, s, key, "t", "fp", lease, time.Minute), idempotency.Acquired, 1)
		if i < 10 {
			if err := s.Complete(ctx, key, "t", okResponse, time.Minute); err != nil {
				t.Fatal(err)
			}
		}
	}
	s.Sweep()
	if n := s.Len(); n != 30 {
		t.Fatalf("Len = %d after a sweep with nothing expired, want 30", n)
	}
	clock.Advance(time.Minute)
	s.Sweep()
	if n := s.Len(); n != 10 {
		t.Fatalf("Len = %d after the TTL, want 10 (the records under a live lease)", n)
	}
	for i := 20; i < 30; i++ {
		wantOutcome(t, acquire(t, s, fmt.Sprint("k", i), "other", "fp", time.Second, time.Minute), idempotency.InFlight, 1)
	}
	clock.Advance(2 * time.Hour)
	s.Sweep()
	if n := s.Len(); n != 0 {
		t.Fatalf("Len = %d after every lease ended, want 0", n)
	}
}

func TestBackgroundSweep(t *testing.T) {
	t.Parallel()
	s, clock := newStore(t, memstore.WithSweepInterval(time.Millisecond))
	fill(t, s, 20, time.Second, time.Second)
	if n := s.Len(); n != 20 {
		t.Fatalf("Len = %d, want 20", n)
	}
	clock.Advance(time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for s.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("Len = %d 5s after every record expired, want 0", s.Len())
		}
		time.Sleep(time.Millisecond)
	}
}

func TestMaxEntries(t *testing.T) {
	t.Parallel()
	s, clock := newStore(t, memstore.WithMaxEntries(10))
	ctx := context.Background()
	fill(t, s, 10, time.Hour, time.Minute)
	req := idempotency.AcquireRequest{Key: "new", Token: "n", Fingerprint: "fp", Lease: time.Hour, TTL: time.Minute}
	if _, err := s.Acquire(ctx, req); !errors.Is(err, idempotency.ErrStoreFull) {
		t.Fatalf("Acquire of a new key when full: %v, want ErrStoreFull", err)
	}
	// Existing records still answer.
	wantOutcome(t, acquire(t, s, "k0", "other", "fp", time.Hour, time.Minute), idempotency.InFlight, 1)

	// Live COMPLETE records are not evicted either.
	for i := range 5 {
		if err := s.Complete(ctx, fmt.Sprint("k", i), "t", okResponse, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Acquire(ctx, req); !errors.Is(err, idempotency.ErrStoreFull) {
		t.Fatalf("Acquire with only live records: %v, want ErrStoreFull", err)
	}
	for i := range 5 {
		wantOutcome(t, acquire(t, s, fmt.Sprint("k", i), "other", "fp", time.Hour, time.Minute), idempotency.Completed, 0)
	}

	// Expired records make room, wherever their shard.
	clock.Advance(time.Second)
	wantOutcome(t, acquire(t, s, "new", "n", "fp", time.Hour, time.Minute), idempotency.Acquired, 1)
	// Acquire purged at least the expired records of its own shard.
	if n := s.Len(); n < 6 || n > 10 {
		t.Fatalf("Len = %d, want 6 to 10", n)
	}
	s.Sweep()
	if n := s.Len(); n != 6 {
		t.Fatalf("Len = %d after a sweep, want 6", n)
	}
	// The IN_PROGRESS records past their TTL but under a live lease stay.
	for i := 5; i < 10; i++ {
		wantOutcome(t, acquire(t, s, fmt.Sprint("k", i), "other", "fp", time.Hour, time.Minute), idempotency.InFlight, 1)
	}
	// Releasing frees room too.
	for i := range 4 {
		wantOutcome(t, acquire(t, s, fmt.Sprint("more", i), "t", "fp", time.Hour, time.Minute), idempotency.Acquired, 1)
	}
	if _, err := s.Acquire(ctx, idempotency.AcquireRequest{Key: "last", Token: "l", Fingerprint: "fp", Lease: time.Hour, TTL: time.Minute}); !errors.Is(err, idempotency.ErrStoreFull) {
		t.Fatalf("Acquire when full again: %v, want ErrStoreFull", err)
	}
	if err := s.Release(ctx, "more0", "t"); err != nil {
		t.Fatal(err)
	}
	wantOutcome(t, acquire(t, s, "last", "l", "fp", time.Hour, time.Minute), idempotency.Acquired, 1)
}

func TestFullStorePurgesOtherShards(t *testing.T) {
	t.Parallel()
	s, clock := newStore(t, memstore.WithMaxEntries(1))
	ctx := context.Background()
	wantOutcome(t, acquire(t, s, "old", "t", "fp", time.Hour, time.Hour), idempotency.Acquired, 1)
	if err := s.Complete(ctx, "old", "t", okResponse, time.Second); err != nil {
		t.Fatal(err)
	}
	other := ""
	for i := 0; other == ""; i++ {
		if k := fmt.Sprint("new", i); s.ShardOf(k) != s.ShardOf("old") {
			other = k
		}
	}
	req := idempotency.AcquireRequest{Key: other, Token: "n", Fingerprint: "fp", Lease: time.Hour, TTL: time.Hour}
	if _, err := s.Acquire(ctx, req); !errors.Is(err, idempotency.ErrStoreFull) {
		t.Fatalf("Acquire with a live COMPLETE record filling the store: %v, want ErrStoreFull", err)
	}
	clock.Advance(time.Second)
	wantOutcome(t, acquire(t, s, other, "n", "fp", time.Hour, time.Hour), idempotency.Acquired, 1)
	if n := s.Len(); n != 1 {
		t.Fatalf("Len = %d, want 1", n)
	}
}

func TestMaxEntriesConcurrent(t *testing.T) {
	t.Parallel()
	const limit, callers = 100, 400
	s, _ := newStore(t, memstore.WithMaxEntries(limit))
	var wg sync.WaitGroup
	var mu sync.Mutex
	count := map[string]int{}
	start := make(chan struct{})
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			a, err := s.Acquire(context.Background(), idempotency.AcquireRequest{
				Key: fmt.Sprint("k", i), Token: "t", Fingerprint: "fp", Lease: time.Hour, TTL: time.Hour,
			})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, idempotency.ErrStoreFull):
				count["full"]++
			case err != nil:
				t.Errorf("Acquire: %v", err)
			default:
				count[a.Outcome.String()]++
			}
		}()
	}
	close(start)
	wg.Wait()
	if count["acquired"] != limit || count["full"] != callers-limit {
		t.Fatalf("outcomes %v, want %d acquired and %d full", count, limit, callers-limit)
	}
	if n := s.Len(); n != limit {
		t.Fatalf("Len = %d, want %d", n, limit)
	}
}

func TestWatchRegistrations(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	wantOutcome(t, acquire(t, s, "k", "t", "fp", time.Hour, time.Hour), idempotency.Acquired, 1)

	var stops []func()
	for range 3 {
		_, stop, err := s.Watch(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		stops = append(stops, stop)
	}
	if n := s.WatchedKeys(); n != 1 {
		t.Fatalf("WatchedKeys = %d with three waiters on one key, want 1", n)
	}
	stops[0]()
	stops[0]() // a second stop is harmless and does not count twice
	stops[1]()
	if n := s.WatchedKeys(); n != 1 {
		t.Fatalf("WatchedKeys = %d with one waiter left, want 1", n)
	}
	stops[2]()
	if n := s.WatchedKeys(); n != 0 {
		t.Fatalf("WatchedKeys = %d after every stop, want 0", n)
	}

	ch, stop, err := s.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, "k", "t", okResponse, time.Hour); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	default:
		t.Fatal("Complete returned before closing the waiter's channel")
	}
	if n := s.WatchedKeys(); n != 0 {
		t.Fatalf("WatchedKeys = %d after the wake, want 0", n)
	}
	// A waiter registered after the wake is not affected by an old stop.
	ch2, stop2, err := s.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if n := s.WatchedKeys(); n != 1 {
		t.Fatalf("WatchedKeys = %d: an old stop removed a newer waiter", n)
	}
	stop2()
	select {
	case <-ch2:
		t.Fatal("a stopped waiter's channel was closed without a change")
	default:
	}
}

func TestClose(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	wantOutcome(t, acquire(t, s, "k", "t", "fp", time.Hour, time.Hour), idempotency.Acquired, 1)
	ch, stop, err := s.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case <-ch:
	default:
		t.Fatal("Close left a waiter asleep")
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if n := s.Len(); n != 0 {
		t.Fatalf("Len = %d after Close, want 0", n)
	}
	req := idempotency.AcquireRequest{Key: "k", Token: "t", Fingerprint: "fp", Lease: time.Hour, TTL: time.Hour}
	_, aerr := s.Acquire(ctx, req)
	_, _, werr := s.Watch(ctx, "k")
	for name, err := range map[string]error{
		"Acquire":  aerr,
		"Complete": s.Complete(ctx, "k", "t", okResponse, time.Hour),
		"Release":  s.Release(ctx, "k", "t"),
		"Extend":   s.Extend(ctx, "k", "t", time.Hour),
		"Watch":    werr,
	} {
		if !errors.Is(err, idempotency.ErrStoreClosed) {
			t.Errorf("%s after Close: %v, want ErrStoreClosed", name, err)
		}
	}
}

func TestInvalidArguments(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	good := idempotency.AcquireRequest{Key: "k", Token: "t", Fingerprint: "fp", Lease: time.Second, TTL: time.Second}
	for name, mutate := range map[string]func(*idempotency.AcquireRequest){
		"EmptyKey":      func(r *idempotency.AcquireRequest) { r.Key = "" },
		"EmptyToken":    func(r *idempotency.AcquireRequest) { r.Token = "" },
		"ZeroLease":     func(r *idempotency.AcquireRequest) { r.Lease = 0 },
		"NegativeTTL":   func(r *idempotency.AcquireRequest) { r.TTL = -time.Second },
		"NegativeLease": func(r *idempotency.AcquireRequest) { r.Lease = -1 },
	} {
		r := good
		mutate(&r)
		if _, err := s.Acquire(ctx, r); !errors.Is(err, memstore.ErrInvalid) {
			t.Errorf("Acquire %s: %v, want ErrInvalid", name, err)
		}
	}
	if n := s.Len(); n != 0 {
		t.Fatalf("Len = %d after refused Acquires, want 0", n)
	}
	wantOutcome(t, acquire(t, s, "k", "t", "fp", time.Hour, time.Hour), idempotency.Acquired, 1)
	if err := s.Complete(ctx, "k", "t", nil, time.Hour); !errors.Is(err, memstore.ErrInvalid) {
		t.Errorf("Complete with a nil response: %v, want ErrInvalid", err)
	}
	if err := s.Complete(ctx, "k", "t", okResponse, 0); !errors.Is(err, memstore.ErrInvalid) {
		t.Errorf("Complete with TTL 0: %v, want ErrInvalid", err)
	}
	if err := s.Extend(ctx, "k", "t", -time.Second); !errors.Is(err, memstore.ErrInvalid) {
		t.Errorf("Extend with a negative lease: %v, want ErrInvalid", err)
	}
	if err := s.Complete(ctx, "k", "", okResponse, time.Hour); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Errorf("Complete with an empty token: %v, want ErrLeaseLost", err)
	}
	// The record survived the refused calls.
	wantOutcome(t, acquire(t, s, "k", "other", "fp", time.Hour, time.Hour), idempotency.InFlight, 1)
	// Huge durations saturate instead of wrapping into the past.
	wantOutcome(t, acquire(t, s, "huge", "t", "fp", 1<<63-1, 1<<63-1), idempotency.Acquired, 1)
	wantOutcome(t, acquire(t, s, "huge", "other", "fp", time.Hour, time.Hour), idempotency.InFlight, 1)
}

func TestOptionsPanic(t *testing.T) {
	t.Parallel()
	for name, f := range map[string]func(){
		"WithMaxEntries(0)":     func() { memstore.WithMaxEntries(0) },
		"WithMaxBytes(0)":       func() { memstore.WithMaxBytes(0) },
		"WithMaxBytes(-1)":      func() { memstore.WithMaxBytes(-1) },
		"WithSweepInterval(0)":  func() { memstore.WithSweepInterval(0) },
		"WithSweepInterval(-1)": func() { memstore.WithSweepInterval(-1) },
		"WithClock(nil)":        func() { memstore.WithClock(nil) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s did not panic", name)
				}
			}()
			f()
		}()
	}
}

func TestCancelledContext(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := idempotency.AcquireRequest{Key: "k", Token: "t", Fingerprint: "fp", Lease: time.Hour, TTL: time.Hour}
	if _, err := s.Acquire(ctx, req); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire with a cancelled context: %v, want context.Canceled", err)
	}
	if n := s.Len(); n != 0 {
		t.Fatalf("Len = %d after a cancelled Acquire, want 0", n)
	}
}
