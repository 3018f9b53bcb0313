package replaycache_test

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/memstore"
	"github.com/go-idempotency/idempotency/replaycache"
)

// wantReplay checks that a replays want.
func wantReplay(t *testing.T, a idempotency.Acquisition, want *idempotency.Response) {
	t.Helper()
	if a.Outcome != idempotency.Completed || a.Response == nil || !reflect.DeepEqual(*a.Response, *want) {
		t.Fatalf("acquisition %+v (response %+v), want completed with %+v", a, a.Response, want)
	}
}

func TestHitsAnswerWithoutTheStore(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	store := &counting{Store: newMemstore(t, clock)}
	c := replaycache.New(store, replaycache.WithClock(clock.Now), replaycache.WithMaxAge(2*time.Hour))
	want := response("a")
	complete(t, c, "k", "a", "fp", want, time.Hour)

	// The first duplicate asks the store, and the record is kept.
	a := acquire(t, c, "k", "d0", "fp")
	wantReplay(t, a, want)
	if a.ExpiresIn != time.Hour {
		t.Fatalf("first duplicate: ExpiresIn = %v, want 1h", a.ExpiresIn)
	}
	calls := store.acquires.Load()
	if calls != 2 {
		t.Fatalf("store Acquires = %d after the first execution and one duplicate, want 2", calls)
	}

	clock.Advance(10 * time.Minute)
	for i, token := range []string{"d1", "d2", "a"} { // the holder's own retry too
		a := acquire(t, c, "k", token, "fp")
		wantReplay(t, a, want)
		if a.ExpiresIn != 50*time.Minute {
			t.Fatalf("duplicate %d: ExpiresIn = %v, want the 50m left on the record", i, a.ExpiresIn)
		}
	}
	// Another fingerprint is told Mismatch, by the cache too.
	if a := acquire(t, c, "k", "m", "other"); a.Outcome != idempotency.Mismatch || a.Response != nil {
		t.Fatalf("other fingerprint: %+v, want mismatch", a)
	}
	if n := store.acquires.Load(); n != calls {
		t.Fatalf("store Acquires = %d after cached duplicates, want %d", n, calls)
	}
	st := c.Stats()
	if st.Hits != 4 || st.Misses != 2 || st.Entries != 1 || st.Bytes <= replaycache.EntryOverhead {
		t.Fatalf("Stats = %+v, want 4 hits, 2 misses, one entry", st)
	}
}

func TestEntryEndsWithTheRecord(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	store := &counting{Store: newMemstore(t, clock)}
	c := replaycache.New(store, replaycache.WithClock(clock.Now), replaycache.WithMaxAge(time.Hour))
	complete(t, c, "k", "a", "fp", response("a"), time.Minute)
	wantReplay(t, acquire(t, c, "k", "d", "fp"), response("a"))
	calls := store.acquires.Load()

	clock.Advance(time.Minute - time.Nanosecond)
	a := acquire(t, c, "k", "d", "fp")
	wantReplay(t, a, response("a"))
	if a.ExpiresIn != time.Millisecond {
		t.Fatalf("1ns before expiry: ExpiresIn = %v, want the 1ms floor", a.ExpiresIn)
	}
	if n := store.acquires.Load(); n != calls {
		t.Fatalf("store Acquires = %d before expiry, want %d", n, calls)
	}
	// The record expires: the store is asked, and a new request runs.
	clock.Advance(time.Nanosecond)
	if a := acquire(t, c, "k", "b", "other"); a.Outcome != idempotency.Acquired {
		t.Fatalf("at expiry: %+v, want acquired (the record is gone)", a)
	}
	if n := store.acquires.Load(); n != calls+1 {
		t.Fatalf("store Acquires = %d at expiry, want %d", n, calls+1)
	}
	if st := c.Stats(); st.Entries != 0 || st.Bytes != 0 {
		t.Fatalf("Stats = %+v, want the ended entry dropped", st)
	}
}

// TestExpiryCountsFromTheCall: the store reads its clock after the call
// was sent, so the entry's time counts from the send, and a slow answer
// shortens it rather than taking it past the record's expiry.
func TestExpiryCountsFromTheCall(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	want := response("a")
	store := newStub(func(idempotency.AcquireRequest) (idempotency.Acquisition, error) {
		clock.Advance(3 * time.Second) // the call's round trip
		return idempotency.Acquisition{Outcome: idempotency.Completed, Response: want, ExpiresIn: 10 * time.Second}, nil
	})
	c := replaycache.New(store, replaycache.WithClock(clock.Now), replaycache.WithMaxAge(time.Hour))
	wantReplay(t, acquire(t, c, "k", "d", "fp"), want)
	if a := acquire(t, c, "k", "d", "fp"); a.ExpiresIn != 7*time.Second {
		t.Fatalf("right after a 3s call that said 10s: ExpiresIn = %v, want 7s", a.ExpiresIn)
	}
	clock.Advance(7*time.Second - time.Nanosecond)
	acquire(t, c, "k", "d", "fp")
	if n := len(store.requests()); n != 1 {
		t.Fatalf("store Acquires = %d before the entry's end, want 1", n)
	}
	clock.Advance(time.Nanosecond)
	acquire(t, c, "k", "d", "fp")
	if n := len(store.requests()); n != 2 {
		t.Fatalf("store Acquires = %d at the entry's end, want 2", n)
	}
}

// TestMaxAgeBoundsADeletedRecord: a record deleted from the store before
// its expiry is replayed from the cache for at most the maximum age.
func TestMaxAgeBoundsADeletedRecord(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		opts   []replaycache.Option
		maxAge time.Duration
	}{
		{"default", nil, 10 * time.Second},
		{"WithMaxAge", []replaycache.Option{replaycache.WithMaxAge(time.Second)}, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock()
			want := response("a")
			deleted := false
			store := newStub(func(idempotency.AcquireRequest) (idempotency.Acquisition, error) {
				if deleted {
					return idempotency.Acquisition{Outcome: idempotency.Acquired, Epoch: 1}, nil
				}
				return idempotency.Acquisition{Outcome: idempotency.Completed, Response: want, ExpiresIn: 24 * time.Hour}, nil
			})
			c := replaycache.New(store, append(tc.opts, replaycache.WithClock(clock.Now))...)
			wantReplay(t, acquire(t, c, "k", "d", "fp"), want)
			deleted = true // an operator deletes the record
			clock.Advance(tc.maxAge - time.Nanosecond)
			a := acquire(t, c, "k", "d", "fp")
			wantReplay(t, a, want) // stale, within the bound
			if a.ExpiresIn != 24*time.Hour-tc.maxAge+time.Nanosecond {
				t.Fatalf("ExpiresIn = %v, want the record's time left", a.ExpiresIn)
			}
			clock.Advance(time.Nanosecond)
			if a := acquire(t, c, "k", "d", "fp"); a.Outcome != idempotency.Acquired {
				t.Fatalf("after the maximum age: %+v, want the store's answer (acquired)", a)
			}
			if n := len(store.requests()); n != 2 {
				t.Fatalf("store Acquires = %d, want 2", n)
			}
		})
	}
}

// TestOnlyCompletedWithExpiryIsKept: an answer other than Completed, or a
// Completed that does not tell its expiry, is asked of the store every
// time.
func TestOnlyCompletedWithExpiryIsKept(t *testing.T) {
	t.Parallel()
	for _, a := range []idempotency.Acquisition{
		{Outcome: idempotency.Completed, Response: response("a")}, // no ExpiresIn
		{Outcome: idempotency.Mismatch},
		{Outcome: idempotency.InFlight, Epoch: 1, LeaseRemaining: time.Second},
		{Outcome: idempotency.Acquired, Epoch: 1},
		{Outcome: idempotency.Stolen, Epoch: 2},
	} {
		store := newStub(func(idempotency.AcquireRequest) (idempotency.Acquisition, error) { return a, nil })
		c := replaycache.New(store)
		for range 3 {
			if got := acquire(t, c, "k", "d", "fp"); !reflect.DeepEqual(got, a) {
				t.Fatalf("Acquire = %+v, want the store's %+v", got, a)
			}
		}
		if n := len(store.requests()); n != 3 {
			t.Fatalf("%v (ExpiresIn %v): store Acquires = %d for 3 calls, want 3", a.Outcome, a.ExpiresIn, n)
		}
		if st := c.Stats(); st.Entries != 0 || st.Hits != 0 {
			t.Fatalf("%v: Stats = %+v, want nothing kept", a.Outcome, st)
		}
	}
	// Store errors are not kept either.
	boom := errors.New("boom")
	store := newStub(func(idempotency.AcquireRequest) (idempotency.Acquisition, error) {
		return idempotency.Acquisition{}, boom
	})
	c := replaycache.New(store)
	for range 2 {
		if _, err := c.Acquire(context.Background(), request("k", "d", "fp")); !errors.Is(err, boom) {
			t.Fatalf("Acquire error = %v, want the store's", err)
		}
	}
}

// TestRepliesAreCopies: what one caller gets cannot change what the cache
// gives the next, neither through the store's answer that filled it nor
// through a cached answer.
func TestRepliesAreCopies(t *testing.T) {
	t.Parallel()
	answered := response("a") // the store's own Response
	store := newStub(completed(answered, time.Hour))
	c := replaycache.New(store)
	want := response("a")
	first := acquire(t, c, "k", "d", "fp")
	if first.Response != answered {
		t.Fatal("the first call did not get the store's answer")
	}
	first.Response.Header.Set("Location", "/elsewhere")
	first.Response.Body[2] = 'X'
	second := acquire(t, c, "k", "d", "fp")
	wantReplay(t, second, want)
	third := acquire(t, c, "k", "d", "fp")
	if reflect.ValueOf(second.Response.Header).UnsafePointer() == reflect.ValueOf(third.Response.Header).UnsafePointer() {
		t.Fatal("two replays share one Header map")
	}
	second.Response.Header["Content-Type"][0] = "text/evil"
	second.Response.Header.Add("Set-Cookie", "x=1")
	delete(second.Response.Header, "Location")
	wantReplay(t, third, want)
	wantReplay(t, acquire(t, c, "k", "d", "fp"), want)
}

func TestBodyOmittedIsKept(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	store := &counting{Store: newMemstore(t, clock)}
	c := replaycache.New(store, replaycache.WithClock(clock.Now))
	omitted := &idempotency.Response{Status: 201, Header: response("a").Header, BodyOmitted: true}
	complete(t, c, "k", "a", "fp", omitted, time.Hour)
	for range 3 {
		wantReplay(t, acquire(t, c, "k", "d", "fp"), omitted)
	}
	if n := store.acquires.Load(); n != 2 {
		t.Fatalf("store Acquires = %d, want 2 (the first execution and the first duplicate)", n)
	}
}

// TestInvalidArgumentsReachTheStore: a cached key does not hide an
// argument the store refuses.
func TestInvalidArgumentsReachTheStore(t *testing.T) {
	t.Parallel()
	c := replaycache.New(newMemstore(t, nil))
	complete(t, c, "k", "a", "fp", response("a"), time.Hour)
	wantReplay(t, acquire(t, c, "k", "d", "fp"), response("a"))
	for _, r := range []idempotency.AcquireRequest{
		{Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour},
		{Key: "k", Token: "d", Fingerprint: "fp", TTL: time.Hour},
		{Key: "k", Token: "d", Fingerprint: "fp", Lease: time.Minute},
	} {
		if _, err := c.Acquire(context.Background(), r); !errors.Is(err, memstore.ErrInvalid) {
			t.Fatalf("Acquire(%+v) = %v, want the store's ErrInvalid", r, err)
		}
	}
}

func TestOptionsPanic(t *testing.T) {
	t.Parallel()
	for name, f := range map[string]func(){
		"New(nil)":        func() { replaycache.New(nil) },
		"NewTx(nil)":      func() { replaycache.NewTx(nil) },
		"WithMaxAge(0)":   func() { replaycache.WithMaxAge(0) },
		"WithMaxBytes(0)": func() { replaycache.WithMaxBytes(0) },
		"WithClock(nil)":  func() { replaycache.WithClock(nil) },
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

// TestAsksTheStoreForTheExpiry: the cache asks the store for the record's
// time left (WantExpiresIn), which a store may tell only when asked, so
// that a store such as redisstore, which tells it only then, gets its
// records kept.
func TestAsksTheStoreForTheExpiry(t *testing.T) {
	t.Parallel()
	want := response("a")
	store := newStub(func(req idempotency.AcquireRequest) (idempotency.Acquisition, error) {
		a := idempotency.Acquisition{Outcome: idempotency.Completed, Response: want}
		if req.WantExpiresIn {
			a.ExpiresIn = time.Hour
		}
		return a, nil
	})
	c := replaycache.New(store)
	for _, token := range []string{"d0", "d1", "d2"} {
		wantReplay(t, acquire(t, c, "k", token, "fp"), want)
	}
	calls := store.requests()
	if len(calls) != 1 || !calls[0].WantExpiresIn {
		t.Fatalf("store got %+v for 3 duplicates, want one request with WantExpiresIn", calls)
	}
}
