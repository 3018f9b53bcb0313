package memstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/memstore"
)

// TestDuplicatesFollowTheRecord drives duplicates of a record through
// expiry, a new record, a purge and Close: they must never be answered
// from a record that is gone.
func TestDuplicatesFollowTheRecord(t *testing.T) {
	t.Parallel()
	s, clock := newStore(t)
	ctx := context.Background()
	first := &idempotency.Response{Status: http.StatusCreated, Body: []byte("first")}
	second := &idempotency.Response{Status: http.StatusCreated, Body: []byte("second")}
	dup := func(token, fp string) idempotency.Acquisition {
		return acquire(t, s, "k", token, fp, time.Hour, time.Minute)
	}

	wantOutcome(t, dup("a", "fp"), idempotency.Acquired, 1)
	if err := s.Complete(ctx, "k", "a", first, time.Minute); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if a := dup(fmt.Sprint("d", i), "fp"); !replays(a, first) {
			t.Fatalf("duplicate %d: %+v, want the first response", i, a)
		}
		if a := dup(fmt.Sprint("m", i), "other"); a.Outcome != idempotency.Mismatch {
			t.Fatalf("mismatch %d: %+v", i, a)
		}
	}

	// Expired: the record answers no more.
	clock.Advance(time.Minute)
	wantOutcome(t, dup("b", "fp"), idempotency.Acquired, 1)
	if a := dup("c", "fp"); a.Outcome != idempotency.InFlight {
		t.Fatalf("duplicate of the new record: %+v, want InFlight", a)
	}
	if a := dup("c", "other"); a.Outcome != idempotency.Mismatch {
		t.Fatalf("mismatch of the new record: %+v", a)
	}
	if err := s.Complete(ctx, "k", "b", second, time.Minute); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if a := dup("e", "fp"); !replays(a, second) {
			t.Fatalf("duplicate %d of the new record: %+v, want the second response", i, a)
		}
	}

	// Purged by the sweep: absent.
	clock.Advance(time.Minute)
	s.Sweep()
	if n := s.Len(); n != 0 {
		t.Fatalf("Len after the sweep = %d", n)
	}
	wantOutcome(t, dup("f", "other"), idempotency.Acquired, 1)

	// Closed: completed records answer no more either.
	if err := s.Complete(ctx, "k", "f", first, time.Minute); err != nil {
		t.Fatal(err)
	}
	dup("g", "other")
	s.Close()
	if _, err := s.Acquire(ctx, idempotency.AcquireRequest{Key: "k", Token: "h", Fingerprint: "other", Lease: time.Hour, TTL: time.Minute}); !errors.Is(err, idempotency.ErrStoreClosed) {
		t.Fatalf("Acquire after Close = %v, want ErrStoreClosed", err)
	}
}

// TestConcurrentDuplicatesAcrossExpiry sends duplicates from many
// goroutines while the record expires: exactly one of them takes the key,
// and no goroutine sees the old response after it has seen the new record.
func TestConcurrentDuplicatesAcrossExpiry(t *testing.T) {
	t.Parallel()
	const readers = 16
	s, clock := newStore(t)
	ctx := context.Background()
	old := &idempotency.Response{Status: http.StatusCreated, Body: []byte("old")}
	fresh := &idempotency.Response{Status: http.StatusCreated, Body: []byte("new")}
	if a := acquire(t, s, "k", "owner", "fp", time.Hour, time.Minute); a.Outcome != idempotency.Acquired {
		t.Fatal(a)
	}
	if err := s.Complete(ctx, "k", "owner", old, time.Minute); err != nil {
		t.Fatal(err)
	}

	var acquired atomic.Int32
	var replayed, wg sync.WaitGroup
	errs := make(chan error, readers)
	replayed.Add(readers)
	wg.Add(readers)
	for r := range readers {
		go func() {
			defer wg.Done()
			token := fmt.Sprint("reader", r)
			// phase: 0 seen only the old record, 1 seen the new one in
			// flight, 2 seen the new response.
			phase, n := 0, 0
			for phase < 2 {
				a, err := s.Acquire(ctx, idempotency.AcquireRequest{Key: "k", Token: token, Fingerprint: "fp", Lease: time.Hour, TTL: time.Minute})
				if n++; n == 1 {
					replayed.Done()
				}
				switch {
				case err != nil:
					errs <- err
					return
				case replays(a, old):
					if phase > 0 {
						errs <- fmt.Errorf("%s: old response after phase %d", token, phase)
						return
					}
				case replays(a, fresh):
					phase = 2
				case a.Outcome == idempotency.InFlight:
					phase = 1
				case a.Outcome == idempotency.Acquired:
					acquired.Add(1)
					phase = 1
					if err := s.Complete(ctx, "k", token, fresh, time.Minute); err != nil {
						errs <- err
						return
					}
				default:
					errs <- fmt.Errorf("%s: unexpected %+v", token, a)
					return
				}
			}
		}()
	}
	replayed.Wait() // every reader is replaying the old record
	clock.Advance(time.Minute)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := acquired.Load(); n != 1 {
		t.Fatalf("%d readers took the expired key, want exactly 1", n)
	}
}

// TestStoredForm: a record keeps a copy of the response, so the caller's
// later changes to its headers or body do not reach replays, and a status
// outside 200..599 is refused.
func TestStoredForm(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	stored := &idempotency.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}},
		Body:   []byte(`{"id":1}`),
	}
	want := &idempotency.Response{Status: stored.Status, Header: stored.Header.Clone(), Body: bytes.Clone(stored.Body)}
	wantOutcome(t, acquire(t, s, "k", "a", "fp", time.Hour, time.Minute), idempotency.Acquired, 1)

	if err := s.Complete(ctx, "k", "a", &idempotency.Response{Status: 101}, time.Minute); !errors.Is(err, memstore.ErrInvalid) {
		t.Fatalf("Complete with status 101 = %v, want ErrInvalid", err)
	}
	wantOutcome(t, acquire(t, s, "k", "x", "fp", time.Hour, time.Minute), idempotency.InFlight, 1)
	if err := s.Complete(ctx, "k", "a", stored, time.Minute); err != nil {
		t.Fatal(err)
	}
	// The caller reuses its map, its values and its body's bytes.
	stored.Header.Set("Content-Type", "text/plain")
	stored.Header["X-Multi"][0] = "changed"
	copy(stored.Body, "XXXX")

	for i := range 3 {
		a := acquire(t, s, "k", fmt.Sprint("d", i), "fp", time.Hour, time.Minute)
		if !replays(a, want) {
			t.Fatalf("duplicate %d: %+v, want %+v", i, a.Response, want)
		}
	}
}
