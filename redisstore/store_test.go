package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/redisstore"
	"github.com/redis/go-redis/v9"
)

var ctx = context.Background()

func sampleResponse() *idempotency.Response {
	return &idempotency.Response{
		Status: 201,
		Header: http.Header{
			"Content-Type": {"application/json"},
			"Location":     {"/payments/42"},
			"X-Multi":      {"a", "b", ""},
		},
		Body: []byte(`{"id":42,"amount":"10.00"}` + "\x00\xff binary"),
	}
}

func TestLifecycle(t *testing.T) {
	c := newClient(t)
	s := newStore(t, c)
	key := randKey()

	a := mustAcquire(t, s, req(key, "t1"), idempotency.Acquired)
	if a.Epoch != 1 {
		t.Fatalf("epoch = %d, want 1", a.Epoch)
	}
	// The holder's own retry gets the same answer.
	mustAcquire(t, s, req(key, "t1"), idempotency.Acquired)
	// Another token sees the live lease.
	in := mustAcquire(t, s, req(key, "t2"), idempotency.InFlight)
	if in.Epoch != 1 || in.LeaseRemaining <= 0 || in.LeaseRemaining > 10*time.Second {
		t.Fatalf("in flight = %+v", in)
	}
	// A different fingerprint is a mismatch.
	bad := req(key, "t3")
	bad.Fingerprint = "other"
	mustAcquire(t, s, bad, idempotency.Mismatch)

	if err := s.Extend(ctx, key, "t1", 5*time.Second); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if err := s.Extend(ctx, key, "t2", 5*time.Second); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("Extend by another token = %v, want ErrLeaseLost", err)
	}
	if err := s.Complete(ctx, key, "t2", sampleResponse(), time.Hour); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("Complete by another token = %v, want ErrLeaseLost", err)
	}
	want := sampleResponse()
	if err := s.Complete(ctx, key, "t1", want, time.Hour); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	// A retried Complete succeeds and changes nothing.
	if err := s.Complete(ctx, key, "t1", want, time.Hour); err != nil {
		t.Fatalf("retried Complete: %v", err)
	}
	got := mustAcquire(t, s, req(key, "t4"), idempotency.Completed)
	if !reflect.DeepEqual(got.Response, want) {
		t.Fatalf("replayed %+v, want %+v", got.Response, want)
	}
	mustAcquire(t, s, bad, idempotency.Mismatch)
	if err := s.Release(ctx, key, "t1"); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("Release of COMPLETE = %v, want ErrLeaseLost", err)
	}
	if err := s.Extend(ctx, key, "t1", time.Second); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("Extend of COMPLETE = %v, want ErrLeaseLost", err)
	}
}

func TestReleaseThenReacquire(t *testing.T) {
	s := newStore(t, newClient(t))
	key := randKey()
	mustAcquire(t, s, req(key, "t1"), idempotency.Acquired)
	if err := s.Release(ctx, key, "t2"); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("Release by another token = %v, want ErrLeaseLost", err)
	}
	if err := s.Release(ctx, key, "t1"); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := s.Release(ctx, key, "t1"); err != nil {
		t.Fatalf("retried Release = %v, want nil", err)
	}
	if err := s.Complete(ctx, key, "t1", sampleResponse(), time.Hour); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("Complete after Release = %v, want ErrLeaseLost", err)
	}
	a := mustAcquire(t, s, req(key, "t2"), idempotency.Acquired)
	if a.Epoch != 1 {
		t.Fatalf("epoch after release = %d, want 1", a.Epoch)
	}
}

func TestStealFencesTheOldHolder(t *testing.T) {
	s := newStore(t, newClient(t))
	key := randKey()
	r := req(key, "old")
	r.Lease = 30 * time.Millisecond
	mustAcquire(t, s, r, idempotency.Acquired)

	// The lease expires on the server's clock; poll until a steal works.
	var stolen idempotency.Acquisition
	ok := redistest.WaitFor(5*time.Second, func() bool {
		a, err := s.Acquire(ctx, req(key, "new"))
		if err != nil {
			t.Fatal(err)
		}
		if a.Outcome != idempotency.InFlight && a.Outcome != idempotency.Stolen {
			t.Fatalf("outcome %v while waiting for the steal", a.Outcome)
		}
		stolen = a
		return a.Outcome == idempotency.Stolen
	})
	if !ok {
		t.Fatal("lease never expired")
	}
	if stolen.Epoch != 2 {
		t.Fatalf("epoch after steal = %d, want 2", stolen.Epoch)
	}
	// The thief's retry gets Stolen again, same epoch.
	again := mustAcquire(t, s, req(key, "new"), idempotency.Stolen)
	if again.Epoch != 2 {
		t.Fatalf("retried steal epoch = %d, want 2", again.Epoch)
	}
	for name, err := range map[string]error{
		"Complete": s.Complete(ctx, key, "old", sampleResponse(), time.Hour),
		"Extend":   s.Extend(ctx, key, "old", time.Second),
		"Release":  s.Release(ctx, key, "old"),
	} {
		if !errors.Is(err, idempotency.ErrLeaseLost) {
			t.Errorf("%s by the old holder = %v, want ErrLeaseLost", name, err)
		}
	}
	in := mustAcquire(t, s, req(key, "third"), idempotency.InFlight)
	if in.Epoch != 2 {
		t.Fatalf("in-flight epoch = %d, want 2", in.Epoch)
	}
	if err := s.Complete(ctx, key, "new", sampleResponse(), time.Hour); err != nil {
		t.Fatalf("Complete by the thief: %v", err)
	}
	mustAcquire(t, s, req(key, "third"), idempotency.Completed)
}

func TestExtendKeepsTheLease(t *testing.T) {
	c := newClient(t)
	s := newStore(t, c)
	key := randKey()
	r := req(key, "t1")
	r.Lease, r.TTL = 50*time.Millisecond, 50*time.Millisecond
	mustAcquire(t, s, r, idempotency.Acquired)
	if err := s.Extend(ctx, key, "t1", time.Hour); err != nil {
		t.Fatal(err)
	}
	// The key's expiry follows the lease, well past the 50ms TTL.
	pttl := c.PTTL(ctx, s.RecordKey(key)).Val()
	if pttl < 59*time.Minute {
		t.Fatalf("PTTL after Extend = %v, want about 1h", pttl)
	}
	in := mustAcquire(t, s, req(key, "t2"), idempotency.InFlight)
	if in.LeaseRemaining < 59*time.Minute {
		t.Fatalf("lease remaining %v, want about 1h", in.LeaseRemaining)
	}

	// A shorter lease never brings the TTL deadline forward.
	key = randKey()
	mustAcquire(t, s, req(key, "t1"), idempotency.Acquired) // lease 10s, TTL 1h
	if err := s.Extend(ctx, key, "t1", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if pttl := c.PTTL(ctx, s.RecordKey(key)).Val(); pttl < 59*time.Minute {
		t.Fatalf("PTTL after a short Extend = %v, want the 1h TTL kept", pttl)
	}
	in = mustAcquire(t, s, req(key, "t2"), idempotency.InFlight)
	if in.LeaseRemaining > 2*time.Second || in.LeaseRemaining < time.Second {
		t.Fatalf("lease remaining %v, want the new 2s lease", in.LeaseRemaining)
	}
}

func TestCompleteExpiresAfterTTL(t *testing.T) {
	c := newClient(t)
	s := newStore(t, c)
	key := randKey()
	mustAcquire(t, s, req(key, "t1"), idempotency.Acquired)
	if err := s.Complete(ctx, key, "t1", sampleResponse(), 40*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, s, req(key, "t2"), idempotency.Completed)
	// Redis purges the record itself.
	if !redistest.WaitFor(5*time.Second, func() bool { return c.Exists(ctx, s.RecordKey(key)).Val() == 0 }) {
		t.Fatal("COMPLETE record not purged after its TTL")
	}
	a := mustAcquire(t, s, req(key, "t3"), idempotency.Acquired)
	if a.Epoch != 1 {
		t.Fatalf("epoch = %d, want 1", a.Epoch)
	}
}

func TestInProgressKeptForLongerOfLeaseAndTTL(t *testing.T) {
	c := newClient(t)
	s := newStore(t, c)
	key := randKey()
	r := req(key, "t1")
	r.Lease, r.TTL = 2*time.Hour, time.Hour
	mustAcquire(t, s, r, idempotency.Acquired)
	if pttl := c.PTTL(ctx, s.RecordKey(key)).Val(); pttl < 119*time.Minute || pttl > 2*time.Hour {
		t.Fatalf("PTTL = %v, want the 2h lease", pttl)
	}
	key2 := randKey()
	r = req(key2, "t1")
	r.Lease, r.TTL = time.Second, time.Hour
	mustAcquire(t, s, r, idempotency.Acquired)
	if pttl := c.PTTL(ctx, s.RecordKey(key2)).Val(); pttl < 59*time.Minute || pttl > time.Hour {
		t.Fatalf("PTTL = %v, want the 1h TTL", pttl)
	}
}

func TestRecordLayout(t *testing.T) {
	c := newClient(t)
	s := newStore(t, c)
	key := randKey()
	mustAcquire(t, s, req(key, "t1"), idempotency.Acquired)
	rkey := s.RecordKey(key)
	h := c.HGetAll(ctx, rkey).Val()
	for _, f := range []string{"state", "token", "fp", "epoch", "lease"} {
		if h[f] == "" {
			t.Errorf("IN_PROGRESS field %q missing: %v", f, h)
		}
	}
	if len(h) != 5 {
		t.Errorf("IN_PROGRESS record has %d fields, want 5: %v", len(h), h)
	}
	if h["state"] != "in_progress" || h["token"] != "t1" || h["epoch"] != "1" {
		t.Errorf("IN_PROGRESS record = %v", h)
	}
	// lease is the lease's end in Unix milliseconds on the server's clock.
	wantLeaseEnd(t, c, rkey, req(key, "t1").Lease)
	resp := sampleResponse()
	if err := s.Complete(ctx, key, "t1", resp, time.Hour); err != nil {
		t.Fatal(err)
	}
	h = c.HGetAll(ctx, rkey).Val()
	if h["state"] != "complete" || h["body"] != string(resp.Body) {
		t.Errorf("COMPLETE record = %q", h)
	}
	for _, f := range []string{"token", "fp", "epoch", "meta"} {
		if h[f] == "" {
			t.Errorf("COMPLETE field %q missing: %v", f, h)
		}
	}
	// The key's expiry is the TTL, counted from completion.
	if ttl := c.PTTL(ctx, rkey).Val(); ttl <= 59*time.Minute || ttl > time.Hour {
		t.Errorf("COMPLETE record's PTTL = %v, want just under 1h", ttl)
	}
	// Compact: the meta block is smaller than the headers spelled out.
	if n := len(h["meta"]); n == 0 || n > 80 {
		t.Errorf("meta is %d bytes", n)
	}
	if pttl := c.PTTL(ctx, rkey).Val(); pttl < 59*time.Minute || pttl > time.Hour {
		t.Errorf("COMPLETE PTTL = %v, want 1h", pttl)
	}
}

// TestPreviousLeaseForm: an in-progress record whose lease field has the
// previous version's form, "seconds:microseconds:ms" (the server's TIME
// when the lease was taken or extended, and its length), as an upgrade
// finds it in Redis, is judged by that lease: while it lasts a duplicate is
// in flight for the time left, and once it has run out the record is
// stolen. What next writes the lease (a steal, the holder's renewal, an
// extend) writes its end in Unix milliseconds.
func TestPreviousLeaseForm(t *testing.T) {
	c := newClient(t)
	s := newStore(t, c)
	serverNow := func() time.Time {
		t.Helper()
		now, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return now
	}
	// previous returns the lease field the previous version wrote for a
	// lease of length d taken at server time at.
	previous := func(at time.Time, d time.Duration) string {
		return fmt.Sprintf("%d:%d:%d", at.Unix(), at.Nanosecond()/1000, d.Milliseconds())
	}
	plant := func(lease string) (key, rkey string) {
		key = randKey()
		rkey = s.RecordKey(key)
		c.HSet(ctx, rkey, "state", "in_progress", "token", "holder", "fp", req(key, "x").Fingerprint, "epoch", 3, "lease", lease)
		c.PExpire(ctx, rkey, time.Hour)
		return key, rkey
	}

	// A minute's lease taken at .999999 s into the second 20 s before the
	// server's current one: the microseconds count, rounded down to the
	// millisecond, so the lease ends at .999 s.
	now := serverNow()
	taken := time.Unix(now.Unix()-20, 999_999_000)
	field := previous(taken, time.Minute)
	key, rkey := plant(field)
	end := taken.Truncate(time.Millisecond).Add(time.Minute)
	// The script reads the clock in whole milliseconds, rounded down.
	before := serverNow().Truncate(time.Millisecond)
	a := mustAcquire(t, s, req(key, "duplicate"), idempotency.InFlight)
	after := serverNow().Truncate(time.Millisecond)
	if a.Epoch != 3 || a.LeaseRemaining > end.Sub(before) || a.LeaseRemaining < end.Sub(after) {
		t.Errorf("in flight under %q: %+v; want epoch 3 and between %v and %v left", field, a, end.Sub(after), end.Sub(before))
	}
	if got := c.HGet(ctx, rkey, "lease").Val(); got != field {
		t.Errorf("an in-flight answer changed the lease field: %q -> %q", field, got)
	}

	// Run out an hour ago: stolen, with a lease in the new form.
	key, rkey = plant(previous(now.Add(-time.Hour), time.Second))
	if a := mustAcquire(t, s, req(key, "thief"), idempotency.Stolen); a.Epoch != 4 {
		t.Errorf("steal of a run-out lease at epoch 3 gave epoch %d, want 4", a.Epoch)
	}
	wantLeaseEnd(t, c, rkey, req(key, "thief").Lease)
	mustAcquire(t, s, req(key, "holder"), idempotency.InFlight)

	// A lease of a second: the holder's retry renews it to its own length.
	key, rkey = plant(previous(now, time.Second))
	if a := mustAcquire(t, s, req(key, "holder"), idempotency.Stolen); a.Epoch != 3 {
		t.Errorf("holder's retry: epoch %d, want 3", a.Epoch)
	}
	wantLeaseEnd(t, c, rkey, req(key, "holder").Lease)

	// An extend writes the new form.
	key, rkey = plant(previous(now, time.Minute))
	if err := s.Extend(ctx, key, "holder", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	wantLeaseEnd(t, c, rkey, 2*time.Minute)
}

func TestBodyOmittedAndEmpty(t *testing.T) {
	s := newStore(t, newClient(t))
	for _, resp := range []*idempotency.Response{
		{Status: 200},
		{Status: 204, Header: http.Header{"X-A": {"1"}}},
		{Status: 200, Header: http.Header{"Content-Type": {"text/plain"}}, BodyOmitted: true},
		{Status: 599, Body: bytes.Repeat([]byte{0, 1, 2, 0xff}, 300000)},
	} {
		key := randKey()
		mustAcquire(t, s, req(key, "t1"), idempotency.Acquired)
		if err := s.Complete(ctx, key, "t1", resp, time.Hour); err != nil {
			t.Fatal(err)
		}
		got := mustAcquire(t, s, req(key, "t2"), idempotency.Completed).Response
		if !reflect.DeepEqual(got, resp) {
			t.Errorf("replayed %+v, want %+v", got.Status, resp.Status)
		}
	}
}

func TestCompleteDoesNotKeepCallerSlices(t *testing.T) {
	s := newStore(t, newClient(t))
	key := randKey()
	mustAcquire(t, s, req(key, "t1"), idempotency.Acquired)
	resp := sampleResponse()
	if err := s.Complete(ctx, key, "t1", resp, time.Hour); err != nil {
		t.Fatal(err)
	}
	resp.Body[0] = 'X'
	resp.Header.Set("Location", "/elsewhere")
	got := mustAcquire(t, s, req(key, "t2"), idempotency.Completed).Response
	if !reflect.DeepEqual(got, sampleResponse()) {
		t.Fatalf("stored response changed with the caller's: %+v", got)
	}
}

func TestBadInput(t *testing.T) {
	s := newStore(t, newClient(t))
	key := randKey()
	for name, r := range map[string]idempotency.AcquireRequest{
		"empty key":   {Token: "t", Lease: time.Second, TTL: time.Second},
		"empty token": {Key: key, Lease: time.Second, TTL: time.Second},
		"zero lease":  {Key: key, Token: "t", TTL: time.Second},
		"neg TTL":     {Key: key, Token: "t", Lease: time.Second, TTL: -1},
	} {
		if _, err := s.Acquire(ctx, r); err == nil {
			t.Errorf("%s: Acquire succeeded", name)
		}
	}
	mustAcquire(t, s, req(key, "t1"), idempotency.Acquired)
	for name, resp := range map[string]*idempotency.Response{
		"nil":        nil,
		"status 0":   {Status: 0},
		"status 199": {Status: 199},
		"status 600": {Status: 600},
	} {
		if err := s.Complete(ctx, key, "t1", resp, time.Hour); err == nil {
			t.Errorf("Complete(%s) succeeded", name)
		}
	}
	if err := s.Complete(ctx, key, "t1", sampleResponse(), 0); err == nil {
		t.Error("Complete with TTL 0 succeeded")
	}
	if err := s.Extend(ctx, key, "t1", 0); err == nil {
		t.Error("Extend with lease 0 succeeded")
	}
	// Nothing was lost: the record is still ours.
	if err := s.Complete(ctx, key, "t1", sampleResponse(), time.Hour); err != nil {
		t.Fatalf("Complete after bad calls: %v", err)
	}
}

func TestConstructionPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"nil client":   func() { redisstore.New(nil) },
		"empty prefix": func() { redisstore.WithPrefix("") },
		"WAIT 0":       func() { redisstore.WithWAIT(0, time.Second) },
		"WAIT timeout": func() { redisstore.WithWAIT(1, 0) },
		"nil handler":  func() { redisstore.WithWAITErrorHandler(nil) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}

func TestClosed(t *testing.T) {
	s := newStore(t, newClient(t))
	key := randKey()
	changed, stop, err := s.Watch(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake the waiter")
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := s.Acquire(ctx, req(key, "t")); !errors.Is(err, idempotency.ErrStoreClosed) {
		t.Errorf("Acquire after Close = %v", err)
	}
	if err := s.Complete(ctx, key, "t", sampleResponse(), time.Hour); !errors.Is(err, idempotency.ErrStoreClosed) {
		t.Errorf("Complete after Close = %v", err)
	}
	if err := s.Release(ctx, key, "t"); !errors.Is(err, idempotency.ErrStoreClosed) {
		t.Errorf("Release after Close = %v", err)
	}
	if err := s.Extend(ctx, key, "t", time.Second); !errors.Is(err, idempotency.ErrStoreClosed) {
		t.Errorf("Extend after Close = %v", err)
	}
	if _, _, err := s.Watch(ctx, key); !errors.Is(err, idempotency.ErrStoreClosed) {
		t.Errorf("Watch after Close = %v", err)
	}
}

func TestConcurrentAcquireExactlyOneWins(t *testing.T) {
	s := newStore(t, newClient(t))
	for round := 0; round < 5; round++ {
		key := randKey()
		const n = 64
		var wg sync.WaitGroup
		var mu sync.Mutex
		counts := map[idempotency.Outcome]int{}
		start := make(chan struct{})
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				<-start
				a, err := s.Acquire(ctx, req(key, "tok-"+strconv.Itoa(i)))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				counts[a.Outcome]++
				mu.Unlock()
			}(i)
		}
		close(start)
		wg.Wait()
		if counts[idempotency.Acquired] != 1 || counts[idempotency.InFlight] != n-1 {
			t.Fatalf("round %d: outcomes %v, want exactly one acquired", round, counts)
		}
	}
}

func TestConcurrentStealExactlyOneWins(t *testing.T) {
	c := newClient(t)
	s := newStore(t, c)
	key := randKey()
	r := req(key, "dead")
	r.Lease = 20 * time.Millisecond
	mustAcquire(t, s, r, idempotency.Acquired)
	waitLeaseExpired(t, c, s.RecordKey(key))
	const n = 50
	var stolen, inflight, other int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			a, err := s.Acquire(ctx, req(key, "thief-"+strconv.Itoa(i)))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				t.Error(err)
			case a.Outcome == idempotency.Stolen && a.Epoch == 2:
				stolen++
			case a.Outcome == idempotency.InFlight && a.Epoch == 2:
				inflight++
			default:
				other++
			}
		}(i)
	}
	wg.Wait()
	if stolen != 1 || inflight != n-1 || other != 0 {
		t.Fatalf("stolen %d, in flight %d, other %d; want exactly one steal", stolen, inflight, other)
	}
}

// leaseDeadline parses a record's lease field as the scripts write it, the
// lease's end in Unix milliseconds (1 to 15 decimal digits, no leading
// zero), into the time the lease ends.
func leaseDeadline(v string) (time.Time, error) {
	if len(v) == 0 || len(v) > 15 || v[0] == '0' || strings.Trim(v, "0123456789") != "" {
		return time.Time{}, fmt.Errorf("lease field %q: want 1 to 15 decimal digits, no leading zero", v)
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("lease field %q: %v", v, err)
	}
	return time.UnixMilli(ms), nil
}

// wantLeaseEnd checks that the lease field of the record at rkey is in the
// form the scripts write and ends about lease from now on the server's
// clock.
func wantLeaseEnd(t *testing.T, c *redis.Client, rkey string, lease time.Duration) {
	t.Helper()
	v := c.HGet(ctx, rkey, "lease").Val()
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if at, err := leaseDeadline(v); err != nil {
		t.Error(err)
	} else if at.Before(now.Add(lease-5*time.Second)) || at.After(now.Add(lease)) {
		t.Errorf("lease %q ends at %v, want about %v from %v", v, at, lease, now)
	}
}

// waitLeaseExpired polls until the server's clock has passed the end of the
// record's lease, without touching the record.
func waitLeaseExpired(t *testing.T, c *redis.Client, rkey string) {
	t.Helper()
	at, err := leaseDeadline(c.HGet(ctx, rkey, "lease").Val())
	if err != nil {
		t.Fatal(err)
	}
	if !redistest.WaitFor(5*time.Second, func() bool {
		now, err := c.Time(ctx).Result()
		return err == nil && !now.Before(at)
	}) {
		t.Fatal("lease never expired on the server clock")
	}
}
