package memstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/memstore"
)

// inProgressBytes returns what one IN_PROGRESS record of a three-byte key
// held by token "t" with fingerprint "fp" counts for in a store's byte
// total.
func inProgressBytes(t *testing.T) int64 {
	t.Helper()
	s, _ := newStore(t)
	acquire(t, s, "k00", "t", "fp", time.Hour, time.Hour)
	n := s.Bytes()
	if n <= int64(len("k00")+len("t")+len("fp")) {
		t.Fatalf("an IN_PROGRESS record counts for %d bytes, less than its strings", n)
	}
	return n
}

func TestMaxBytes(t *testing.T) {
	t.Parallel()
	per := inProgressBytes(t)
	s, clock := newStore(t, memstore.WithMaxBytes(10*per))
	ctx := context.Background()
	key := func(prefix string, i int) string { return fmt.Sprintf("%s%02d", prefix, i) }
	for i := range 10 {
		wantOutcome(t, acquire(t, s, key("k", i), "t", "fp", time.Hour, time.Minute), idempotency.Acquired, 1)
	}
	if n := s.Bytes(); n != 10*per {
		t.Fatalf("Bytes = %d with 10 records of %d, want %d", n, per, 10*per)
	}
	full := func(what string) {
		t.Helper()
		_, err := s.Acquire(ctx, idempotency.AcquireRequest{Key: "new", Token: "t", Fingerprint: "fp", Lease: time.Hour, TTL: time.Minute})
		if !errors.Is(err, idempotency.ErrStoreFull) || !strings.Contains(err.Error(), "WithMaxBytes") {
			t.Fatalf("Acquire of a new key %s: %v, want ErrStoreFull naming WithMaxBytes", what, err)
		}
	}
	full("when the records fill the bound")
	// Existing records still answer.
	wantOutcome(t, acquire(t, s, "k00", "other", "fp", time.Hour, time.Minute), idempotency.InFlight, 1)

	// Live COMPLETE records are not evicted, and records complete at the
	// bound without going over it: with the status alone, in the room
	// their IN_PROGRESS records held for it.
	done := &idempotency.Response{Status: http.StatusNoContent, Header: http.Header{"X-Id": {"1"}}}
	for i := range 5 {
		if err := s.Complete(ctx, key("k", i), "t", done, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	over := s.Bytes()
	if over != 10*per {
		t.Fatalf("Bytes = %d after completing at the bound, want %d", over, 10*per)
	}
	done = &idempotency.Response{Status: http.StatusNoContent, BodyOmitted: true, HeaderOmitted: true}
	full("with only live records")
	// Duplicates still replay, and the total does not move.
	for i := range 5 {
		for range 3 {
			if a := acquire(t, s, key("k", i), "other", "fp", time.Hour, time.Minute); !replays(a, done) {
				t.Fatalf("duplicate of %s: %+v, want %+v", key("k", i), a, done)
			}
		}
	}
	if n := s.Bytes(); n != over {
		t.Fatalf("Bytes = %d after duplicates at the bound, want %d", n, over)
	}

	// Expired records make room.
	clock.Advance(time.Second)
	wantOutcome(t, acquire(t, s, key("n", 0), "t", "fp", time.Hour, time.Minute), idempotency.Acquired, 1)
	s.Sweep()
	if n := s.Bytes(); n != 6*per {
		t.Fatalf("Bytes = %d after the completed records expired, want %d", n, 6*per)
	}
	for i := 1; i < 5; i++ {
		wantOutcome(t, acquire(t, s, key("n", i), "t", "fp", time.Hour, time.Minute), idempotency.Acquired, 1)
	}
	full("when full again")
	// Releasing makes room too.
	if err := s.Release(ctx, key("n", 1), "t"); err != nil {
		t.Fatal(err)
	}
	wantOutcome(t, acquire(t, s, "new", "t", "fp", time.Hour, time.Minute), idempotency.Acquired, 1)
	if n := s.Bytes(); n != 10*per {
		t.Fatalf("Bytes = %d, want %d", n, 10*per)
	}
}

func TestCompleteOverByteBoundOmitsBody(t *testing.T) {
	t.Parallel()
	per := inProgressBytes(t)
	ctx := context.Background()
	resp := &idempotency.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/payments/1"}},
		Body:   bytes.Repeat([]byte("x"), 1<<10),
	}
	// Room for the record and its status and headers, not for its body.
	s, _ := newStore(t, memstore.WithMaxBytes(per+512))
	wantOutcome(t, acquire(t, s, "k00", "t", "fp", time.Hour, time.Hour), idempotency.Acquired, 1)
	if err := s.Complete(ctx, "k00", "t", resp, time.Hour); err != nil {
		t.Fatalf("Complete over the bound: %v, want nil", err)
	}
	if n := s.Bytes(); n <= per || n > per+512 {
		t.Fatalf("Bytes = %d, want the record and its status and headers, within %d", n, per+512)
	}
	omitted := &idempotency.Response{Status: resp.Status, Header: resp.Header, BodyOmitted: true}
	for i := range 3 {
		a := acquire(t, s, "k00", fmt.Sprint("dup", i), "fp", time.Hour, time.Hour)
		if !replays(a, omitted) {
			t.Fatalf("duplicate %d: %+v, want the status and headers with the body omitted", i, a.Response)
		}
	}
	if err := s.Complete(ctx, "k00", "t", resp, time.Hour); err != nil {
		t.Fatalf("retried Complete: %v", err)
	}
	if a := acquire(t, s, "k00", "dup", "fp", time.Hour, time.Hour); !replays(a, omitted) {
		t.Fatalf("after a retried Complete: %+v, want the first payload", a.Response)
	}

	// With room for the body, the body is kept.
	roomy, _ := newStore(t, memstore.WithMaxBytes(per+4096))
	wantOutcome(t, acquire(t, roomy, "k00", "t", "fp", time.Hour, time.Hour), idempotency.Acquired, 1)
	if err := roomy.Complete(ctx, "k00", "t", resp, time.Hour); err != nil {
		t.Fatal(err)
	}
	if a := acquire(t, roomy, "k00", "dup", "fp", time.Hour, time.Hour); !replays(a, resp) {
		t.Fatalf("duplicate with room: %+v, want the whole response", a.Response)
	}

	// With no room for the headers either, the record keeps the status
	// alone, marked, and the total stays within the bound.
	tight, _ := newStore(t, memstore.WithMaxBytes(per))
	wantOutcome(t, acquire(t, tight, "k00", "t", "fp", time.Hour, time.Hour), idempotency.Acquired, 1)
	if err := tight.Complete(ctx, "k00", "t", resp, time.Hour); err != nil {
		t.Fatal(err)
	}
	if n := tight.Bytes(); n != per {
		t.Fatalf("Bytes = %d, want %d: the status alone fits in the room the record held", n, per)
	}
	statusOnly := &idempotency.Response{Status: resp.Status, BodyOmitted: true, HeaderOmitted: true}
	if a := acquire(t, tight, "k00", "dup", "fp", time.Hour, time.Hour); !replays(a, statusOnly) {
		t.Fatalf("duplicate with no room at all: %+v, want the status alone, marked", a.Response)
	}
}

// TestByteBoundThroughMiddleware checks what a client sees when the store
// has no room for a body: the first request gets the whole response, a
// duplicate gets the status and headers and the body-omitted marker, and
// the handler runs once.
func TestByteBoundThroughMiddleware(t *testing.T) {
	t.Parallel()
	per := inProgressBytes(t)
	// The middleware's storage key and token are longer than the probe's:
	// leave them room, but not room for the body.
	s, _ := newStore(t, memstore.WithMaxBytes(per+1024))
	body := bytes.Repeat([]byte("y"), 64<<10)
	var runs atomic.Int32
	h := idempotency.New(s)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusCreated)
		w.Write(body)
	}))
	serve := func() *http.Response {
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", "key-1")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Result()
	}
	first := serve()
	if got, _ := io.ReadAll(first.Body); first.StatusCode != http.StatusCreated || !bytes.Equal(got, body) {
		t.Fatalf("first request: %d with %d bytes, want 201 with the whole body", first.StatusCode, len(got))
	}
	dup := serve()
	got, _ := io.ReadAll(dup.Body)
	switch {
	case dup.StatusCode != http.StatusCreated:
		t.Fatalf("duplicate: status %d, want 201", dup.StatusCode)
	case dup.Header.Get(idempotency.HeaderBodyOmitted) != "true":
		t.Fatalf("duplicate: headers %v, want %s: true", dup.Header, idempotency.HeaderBodyOmitted)
	case dup.Header.Get("Content-Type") != "application/octet-stream":
		t.Fatalf("duplicate: Content-Type %q, want the stored one", dup.Header.Get("Content-Type"))
	case len(got) != 0:
		t.Fatalf("duplicate: %d bytes of body, want none", len(got))
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// TestBytesReturnToZero follows the byte total through every edge that
// adds to it or takes from it.
func TestBytesReturnToZero(t *testing.T) {
	t.Parallel()
	s, clock := newStore(t)
	ctx := context.Background()
	wantBytes := func(what string, want int64) {
		t.Helper()
		if n := s.Bytes(); n != want {
			t.Fatalf("Bytes = %d %s, want %d", n, what, want)
		}
	}
	resp := &idempotency.Response{Status: http.StatusOK, Header: http.Header{"X-A": {"1"}}, Body: make([]byte, 100, 300)}

	// Acquire, then release.
	wantOutcome(t, acquire(t, s, "k", "t", "fp", time.Second, time.Minute), idempotency.Acquired, 1)
	per := s.Bytes()
	if err := s.Release(ctx, "k", "t"); err != nil {
		t.Fatal(err)
	}
	wantBytes("after a release", 0)

	// A steal counts the new token instead of the old one.
	wantOutcome(t, acquire(t, s, "k", "t", "fp", time.Second, time.Minute), idempotency.Acquired, 1)
	clock.Advance(time.Second)
	wantOutcome(t, acquire(t, s, "k", "longer", "fp", time.Second, time.Minute), idempotency.Stolen, 2)
	wantBytes("after a steal by a longer token", per+int64(len("longer")-len("t")))

	// Complete counts the body at its length, not its array's capacity:
	// the store keeps a copy.
	before := s.Bytes()
	if err := s.Complete(ctx, "k", "longer", resp, time.Minute); err != nil {
		t.Fatal(err)
	}
	completed := s.Bytes()
	if completed < before+int64(len(resp.Body)) {
		t.Fatalf("Bytes = %d after Complete, want at least %d (the body's length)", completed, before+int64(len(resp.Body)))
	}
	wantOutcome(t, acquire(t, s, "j", "longer", "fp", time.Second, time.Minute), idempotency.Acquired, 1)
	tight := &idempotency.Response{Status: resp.Status, Header: resp.Header, Body: resp.Body[:100:100]}
	if err := s.Complete(ctx, "j", "longer", tight, time.Minute); err != nil {
		t.Fatal(err)
	}
	wantBytes("after completing the same response in an array of its own size", 2*completed)
	// Duplicates count for nothing.
	for i := range 3 {
		if a := acquire(t, s, "k", "dup", "fp", time.Second, time.Minute); !replays(a, &idempotency.Response{Status: 200, Header: resp.Header, Body: resp.Body}) {
			t.Fatalf("duplicate %d: %+v", i, a)
		}
	}
	wantBytes("after duplicates", 2*completed)

	// A new record in place of the expired, duplicated one.
	clock.Advance(time.Minute)
	wantOutcome(t, acquire(t, s, "k", "t", "fp", time.Second, time.Minute), idempotency.Acquired, 1)
	wantBytes("after replacing an expired record", per+completed)
	if err := s.Release(ctx, "k", "t"); err != nil {
		t.Fatal(err)
	}
	wantBytes("after releasing the replacement", completed)

	// Purged, duplicated or not.
	for i := range 20 {
		key := fmt.Sprint("p", i)
		wantOutcome(t, acquire(t, s, key, "t", "fp", time.Second, time.Minute), idempotency.Acquired, 1)
		if i%2 == 0 {
			if err := s.Complete(ctx, key, "t", resp, time.Minute); err != nil {
				t.Fatal(err)
			}
			acquire(t, s, key, "dup", "fp", time.Second, time.Minute)
			acquire(t, s, key, "dup", "fp", time.Second, time.Minute)
		}
	}
	clock.Advance(time.Minute)
	s.Sweep()
	wantBytes("after the sweep", 0)
	if n := s.Len(); n != 0 {
		t.Fatalf("Len = %d after the sweep, want 0", n)
	}

	// Close drops everything.
	fill(t, s, 5, time.Hour, time.Hour)
	if s.Bytes() == 0 {
		t.Fatal("Bytes = 0 with five records")
	}
	s.Close()
	wantBytes("after Close", 0)
}

// TestBytesConcurrent runs acquires, completions, releases, duplicates,
// steals and purges from many goroutines on a store at its byte bound: the
// total never goes negative, stays near the bound, and returns to zero once
// every record has expired.
func TestBytesConcurrent(t *testing.T) {
	t.Parallel()
	const (
		workers = 16
		rounds  = 300
		keys    = 128
		bound   = 32 << 10 // a few live records' worth, whatever the interleaving
	)
	s, clock := newStore(t, memstore.WithMaxBytes(bound))
	ctx := context.Background()
	var negative, overshoot atomic.Int64
	check := func() {
		n := s.Bytes()
		if n < 0 {
			negative.Store(n)
		}
		// The overshoot allowed: one status and headers block per
		// Complete at the bound, and longer tokens from steals.
		if n > bound+workers*64 {
			overshoot.Store(n)
		}
	}
	var omitted, full, stolen, lost atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				key := fmt.Sprint("k", (w*7+i)%keys)
				token := fmt.Sprintf("w%d-%d", w, i)
				if w == 0 && i%20 == 0 {
					clock.Advance(10 * time.Second) // expires leases and records as others work
					s.Sweep()
				}
				a, err := s.Acquire(ctx, idempotency.AcquireRequest{Key: key, Token: token, Fingerprint: "fp", Lease: 15 * time.Second, TTL: 30 * time.Second})
				check()
				switch {
				case errors.Is(err, idempotency.ErrStoreFull):
					full.Add(1)
					continue
				case err != nil:
					t.Errorf("Acquire: %v", err)
					return
				}
				if a.Outcome == idempotency.Stolen {
					stolen.Add(1)
				}
				switch a.Outcome {
				case idempotency.Acquired, idempotency.Stolen:
					switch {
					case i%5 == 4:
						// Abandoned: stolen or purged later.
					case i%3 == 0:
						err = s.Release(ctx, key, token)
					default:
						body := make([]byte, (w*131+i*17)%4096)
						for j := range body {
							body[j] = byte(w)
						}
						err = s.Complete(ctx, key, token, &idempotency.Response{Status: http.StatusOK, Body: body}, 30*time.Second)
					}
					if errors.Is(err, idempotency.ErrLeaseLost) {
						lost.Add(1) // stolen or expired meanwhile
					} else if err != nil {
						t.Errorf("Complete or Release: %v", err)
					}
				case idempotency.Completed:
					if a.Response.BodyOmitted {
						omitted.Add(1)
						if len(a.Response.Body) != 0 {
							t.Errorf("a replay with its body omitted has %d bytes of body", len(a.Response.Body))
						}
					} else if b := a.Response.Body; len(b) > 0 && bytes.Count(b, b[:1]) != len(b) {
						t.Errorf("a replayed body mixes the bytes of two responses")
					}
				}
				check()
			}
		}()
	}
	wg.Wait()
	if n := negative.Load(); n != 0 {
		t.Fatalf("Bytes went negative: %d", n)
	}
	if n := overshoot.Load(); n != 0 {
		t.Fatalf("Bytes reached %d, far over the bound of %d", n, bound)
	}
	t.Logf("%d replays with the body omitted, %d acquires refused, %d steals, %d leases lost", omitted.Load(), full.Load(), stolen.Load(), lost.Load())
	if full.Load() == 0 && omitted.Load() == 0 {
		t.Fatalf("the bound of %d bytes was never reached", bound)
	}
	clock.Advance(time.Hour)
	s.Sweep()
	if n, l := s.Bytes(), s.Len(); n != 0 || l != 0 {
		t.Fatalf("Bytes = %d, Len = %d once every record expired, want 0 and 0", n, l)
	}
}

// TestByteBoundHoldsLargeBodies completes 300 records with 1 MiB bodies in
// a store bounded to 8 MiB: the store keeps at most 8 MiB of them, counted
// by replaying every record and by the heap after a GC, where a store
// bounded in records only would hold 300 MiB. It is not parallel, so that
// no other test's allocations blur the heap reading.
func TestByteBoundHoldsLargeBodies(t *testing.T) {
	const (
		records = 300
		size    = 1 << 20
		bound   = 8 << 20
	)
	heap := func() int64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return int64(m.HeapAlloc)
	}
	before := heap()
	s, _ := newStore(t, memstore.WithMaxBytes(bound))
	ctx := context.Background()
	resp := func(i int) *idempotency.Response {
		body := make([]byte, size)
		body[0] = byte(i)
		return &idempotency.Response{Status: http.StatusOK, Header: http.Header{"X-N": {fmt.Sprint(i)}}, Body: body}
	}
	key := func(i int) string { return fmt.Sprintf("%064x", i) }
	for i := range records {
		wantOutcome(t, acquire(t, s, key(i), "t", "fp", time.Hour, time.Hour), idempotency.Acquired, 1)
		if err := s.Complete(ctx, key(i), "t", resp(i), time.Hour); err != nil {
			t.Fatalf("Complete %d: %v", i, err)
		}
	}
	held := heap() - before

	stored := 0
	for i := range records {
		a := acquire(t, s, key(i), "dup", "fp", time.Hour, time.Hour)
		switch {
		case a.Outcome != idempotency.Completed:
			t.Fatalf("record %d: %v, want completed", i, a.Outcome)
		case a.Response.Header.Get("X-N") != fmt.Sprint(i):
			t.Fatalf("record %d: headers %v, want its own", i, a.Response.Header)
		case a.Response.BodyOmitted:
			if len(a.Response.Body) != 0 {
				t.Fatalf("record %d: body omitted, yet %d bytes", i, len(a.Response.Body))
			}
		case len(a.Response.Body) != size || a.Response.Body[0] != byte(i):
			t.Fatalf("record %d: a body of %d bytes, not its own", i, len(a.Response.Body))
		default:
			stored++
		}
	}
	if stored*size > bound || stored < bound/size-2 {
		t.Fatalf("%d bodies of 1 MiB stored under a bound of 8 MiB, want 6 to 8", stored)
	}
	if n := s.Bytes(); n > bound+records*64 {
		t.Fatalf("Bytes = %d, over the bound of %d by more than the status and headers", n, bound)
	}
	// A generous margin over the bound; without it the store holds 300 MiB.
	if held > 2*bound {
		t.Fatalf("the store holds %d bytes of heap after a GC, want at most %d", held, 2*bound)
	}
	t.Logf("%d bodies stored; %d bytes counted; %d bytes of heap held", stored, s.Bytes(), held)
	runtime.KeepAlive(s)
	reliability.Report(t, reliability.Result{Scenario: "bad input: 300 responses of 1 MiB", Store: "memstore",
		Operations: 2 * records, Faults: records,
		Note: fmt.Sprintf("WithMaxBytes(8 MiB): %d bodies kept, the rest stored omitted; %.1f MiB of heap held (was 300 MiB)", stored, float64(held)/(1<<20))})
}

// TestLargeHeadersStayWithinTheBound: 300 records taken at once and then
// completed at once, each with a 512 KiB header (a handler echoing a
// request header), never take the byte total over the bound: those that
// find no room keep the status alone, marked, and every record replays.
func TestLargeHeadersStayWithinTheBound(t *testing.T) {
	t.Parallel()
	const (
		records = 300
		bound   = 8 << 20
	)
	s, _ := newStore(t, memstore.WithMaxBytes(bound))
	ctx := context.Background()
	big := strings.Repeat("x", 512<<10)
	for i := range records {
		wantOutcome(t, acquire(t, s, fmt.Sprint("k", i), "t", "fp", time.Hour, time.Hour), idempotency.Acquired, 1)
	}
	var wg sync.WaitGroup
	for i := range records {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp := &idempotency.Response{Status: http.StatusCreated, Header: http.Header{"X-Trace": {big}}, Body: []byte("ok")}
			if err := s.Complete(ctx, fmt.Sprint("k", i), "t", resp, time.Hour); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if n := s.Bytes(); n > bound {
		t.Fatalf("Bytes = %d (%.1f MiB) after the completions, over the bound of %d MiB", n, float64(n)/(1<<20), bound>>20)
	}
	whole, statusOnly := 0, 0
	for i := range records {
		a := acquire(t, s, fmt.Sprint("k", i), "dup", "fp", time.Hour, time.Hour)
		switch {
		case a.Outcome != idempotency.Completed:
			t.Fatalf("record %d: %v, want Completed", i, a.Outcome)
		case a.Response.HeaderOmitted && a.Response.BodyOmitted && a.Response.Header == nil:
			statusOnly++
		case a.Response.Header.Get("X-Trace") == big && string(a.Response.Body) == "ok":
			whole++
		default:
			t.Fatalf("record %d replays neither whole nor marked: %+v", i, a.Response)
		}
	}
	if whole == 0 || statusOnly == 0 || whole > bound/(512<<10) {
		t.Fatalf("%d whole and %d status-only records under a %d MiB bound", whole, statusOnly, bound>>20)
	}
}
