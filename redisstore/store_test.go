package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/redisrecord"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/internal/wire"
	"github.com/go-idempotency/idempotency/redisstore"
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

// TestHolderRetryRenews: the holder's retried acquire renews its lease to
// run its full length from now when it would end sooner (even when it ran
// out), never shortens it, and moves the key's expiry only when the key
// would expire before the renewed lease ends.
func TestHolderRetryRenews(t *testing.T) {
	c := newClient(t)
	s := newStore(t, c)
	for _, tc := range []struct {
		name       string
		left, pttl time.Duration // planted: lease left and key expiry
		wantLeft   time.Duration
		wantPTTL   time.Duration
	}{
		{"a second left", time.Second, time.Hour, 10 * time.Second, time.Hour},
		{"run out", -time.Minute, time.Hour, 10 * time.Second, time.Hour},
		{"half an hour left", 30 * time.Minute, time.Hour, 30 * time.Minute, time.Hour},
		{"key expires before the renewed lease", 2 * time.Second, 5 * time.Second, 10 * time.Second, 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := randKey()
			rkey := s.RecordKey(key)
			r := req(key, "t1") // lease 10s, TTL 1h
			mustAcquire(t, s, r, idempotency.Acquired)
			hd := head(t, c, rkey)
			hd.Epoch, hd.LeaseEnd = 4, serverTime(t, c).Add(tc.left).UnixMilli()
			c.HSet(ctx, rkey, redisrecord.HeadField, hd.String())
			c.PExpire(ctx, rkey, tc.pttl)
			if a := mustAcquire(t, s, r, idempotency.Stolen); a.Epoch != 4 {
				t.Errorf("holder's retry at epoch 4 answered epoch %d", a.Epoch)
			}
			if left := leaseLeft(t, c, rkey); left <= tc.wantLeft-5*time.Second || left > tc.wantLeft {
				t.Errorf("lease left %v, want about %v", left, tc.wantLeft)
			}
			if pttl := c.PTTL(ctx, rkey).Val(); pttl <= tc.wantPTTL-5*time.Second || pttl > tc.wantPTTL {
				t.Errorf("PTTL %v, want about %v", pttl, tc.wantPTTL)
			}
			if hd2 := head(t, c, rkey); hd2.Token != "t1" || hd2.Epoch != 4 || hd2.Fingerprint != hd.Fingerprint {
				t.Errorf("head after the retry: %+v", hd2)
			}
		})
	}
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

// TestCompletedExpiresIn: a replay asked for it (WantExpiresIn) tells how
// long the record has left, as the server counts it: more than 0, at most
// the TTL, shrinking as time passes and following the key's expiry; a key
// without expiry tells 0 (unknown). A replay not asked for it tells 0 and
// runs no PTTL on the server.
func TestCompletedExpiresIn(t *testing.T) {
	srv := redistest.Start(t)
	c := clientFor(t, srv.Addr())
	s := newStore(t, c)
	key := randKey()
	const ttl = time.Hour
	asked := func(token string) idempotency.AcquireRequest {
		r := req(key, token)
		r.WantExpiresIn = true
		return r
	}
	pttls := func() int { return redistest.CommandCalls(t, srv.Addr(), "pttl") }
	mustAcquire(t, s, req(key, "t1"), idempotency.Acquired)
	if err := s.Complete(ctx, key, "t1", sampleResponse(), ttl); err != nil {
		t.Fatal(err)
	}
	before := pttls()
	for i := range 3 {
		if a := mustAcquire(t, s, req(key, "u"+strconv.Itoa(i)), idempotency.Completed); a.ExpiresIn != 0 {
			t.Fatalf("ExpiresIn = %v unasked, want 0", a.ExpiresIn)
		}
	}
	if n := pttls() - before; n != 0 {
		t.Fatalf("%d PTTL calls for 3 replays not asked for the expiry, want 0", n)
	}
	first := mustAcquire(t, s, asked("t2"), idempotency.Completed)
	if first.ExpiresIn <= ttl-time.Minute || first.ExpiresIn > ttl {
		t.Fatalf("ExpiresIn = %v, want just under the %v TTL", first.ExpiresIn, ttl)
	}
	if n := pttls() - before; n != 1 {
		t.Fatalf("%d PTTL calls for a replay asked for the expiry, want 1", n)
	}
	var later idempotency.Acquisition
	if !redistest.WaitFor(5*time.Second, func() bool {
		later = mustAcquire(t, s, asked("t3"), idempotency.Completed)
		return later.ExpiresIn < first.ExpiresIn
	}) {
		t.Fatalf("ExpiresIn stays at %v", later.ExpiresIn)
	}
	if later.ExpiresIn <= 0 {
		t.Fatalf("ExpiresIn = %v", later.ExpiresIn)
	}
	// The key's expiry is the record's: one set by hand shows.
	rkey := s.RecordKey(key)
	c.PExpire(ctx, rkey, 5*time.Second)
	if a := mustAcquire(t, s, asked("t4"), idempotency.Completed); a.ExpiresIn <= 4*time.Second || a.ExpiresIn > 5*time.Second {
		t.Fatalf("ExpiresIn = %v after PEXPIRE 5s", a.ExpiresIn)
	}
	// A key made persistent by hand has no end the store can tell.
	c.Persist(ctx, rkey)
	if a := mustAcquire(t, s, asked("t5"), idempotency.Completed); a.ExpiresIn != 0 {
		t.Fatalf("ExpiresIn = %v for a key without expiry, want 0 (unknown)", a.ExpiresIn)
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

// TestRecordLayout: the record is one field h while in progress, its
// head, and gains the payload under the field its fingerprint names once
// complete (see README.md, Record layout).
func TestRecordLayout(t *testing.T) {
	c := newClient(t)
	s := newStore(t, c)
	key := randKey()
	r := req(key, "t1")
	mustAcquire(t, s, r, idempotency.Acquired)
	rkey := s.RecordKey(key)
	h := c.HGetAll(ctx, rkey).Val()
	hd := head(t, c, rkey)
	want := redisrecord.Head{State: redisrecord.InProgress, Token: "t1", Epoch: 1, LeaseEnd: hd.LeaseEnd, Fingerprint: r.Fingerprint}.String()
	if len(h) != 1 || h["h"] != want {
		t.Fatalf("IN_PROGRESS record = %q, want only h = %q", h, want)
	}
	// The head holds the lease's end, 10s from the server's TIME, in Unix
	// milliseconds; the key expires at the TTL deadline.
	if pttl := c.PTTL(ctx, rkey).Val(); pttl <= r.TTL-5*time.Second || pttl > r.TTL {
		t.Errorf("IN_PROGRESS PTTL = %v, want the %v TTL", pttl, r.TTL)
	}
	wantLeaseLeft(t, c, rkey, r.Lease)

	resp := sampleResponse()
	if err := s.Complete(ctx, key, "t1", resp, time.Minute); err != nil {
		t.Fatal(err)
	}
	h = c.HGetAll(ctx, rkey).Val()
	payload := h[redisrecord.PayloadField(r.Fingerprint)]
	hd.State = redisrecord.Complete
	if len(h) != 2 || h["h"] != hd.String() || payload == "" {
		t.Fatalf("COMPLETE record = %q", h)
	}
	// The payload: the meta block, the body. Compact: the meta block is
	// smaller than the headers spelled out.
	meta, body, err := redisrecord.SplitPayload(payload)
	if err != nil || len(meta) == 0 || len(meta) > 80 || body != string(resp.Body) {
		t.Errorf("payload %q: meta block of %d bytes, %v; want one under 80 bytes and then the body", payload, len(meta), err)
	}
	if want, err := wire.AppendMeta(nil, resp); err != nil || meta != string(want) {
		t.Errorf("payload's meta block %q, want %q (%v)", meta, want, err)
	}
	// The key's expiry is the TTL, counted from completion.
	if pttl := c.PTTL(ctx, rkey).Val(); pttl <= 59*time.Second || pttl > time.Minute {
		t.Errorf("COMPLETE record's PTTL = %v, want just under 1m", pttl)
	}
}

// TestRecordLayoutLeaseLongerThanTTL: when the lease outlives the TTL the
// key expires when the lease ends.
func TestRecordLayoutLeaseLongerThanTTL(t *testing.T) {
	c := newClient(t)
	s := newStore(t, c)
	key := randKey()
	r := req(key, "t1")
	r.Lease, r.TTL = time.Hour, time.Minute
	mustAcquire(t, s, r, idempotency.Acquired)
	if hd := head(t, c, s.RecordKey(key)); hd.Epoch != 1 || hd.Token != "t1" {
		t.Fatalf("head %+v; want epoch 1, token t1", hd)
	}
	wantLeaseLeft(t, c, s.RecordKey(key), time.Hour)
	if pttl := c.PTTL(ctx, s.RecordKey(key)).Val(); pttl <= 59*time.Minute || pttl > time.Hour {
		t.Errorf("PTTL = %v, want the hour's lease", pttl)
	}
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
		counts := map[idempotency.AcquireOutcome]int{}
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
