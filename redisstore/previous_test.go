package redisstore_test

import (
	_ "embed"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/wire"
	"github.com/redis/go-redis/v9"
)

// Records of the previous layout are hashes with the fields state, token,
// fp, epoch, lease, meta, body and watched; the lease field is the lease's
// end in Unix milliseconds, or, from the version before, "seconds:
// microseconds:ms". During a rolling upgrade such records are in Redis
// (COMPLETE ones for their whole TTL), and instances of the previous
// version keep writing them.

// TestPreviousLayout plants records of the previous layout and runs every
// edge of the current store on them.
func TestPreviousLayout(t *testing.T) {
	c := newClient(t)
	s := newStore(t, c)
	meta, err := wire.AppendMeta(nil, sampleResponse())
	if err != nil {
		t.Fatal(err)
	}
	serverNow := func() time.Time {
		t.Helper()
		now, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return now
	}
	// endsIn is a lease field of the previous layout ending d from now.
	endsIn := func(d time.Duration) string { return fmt.Sprint(serverNow().Add(d).UnixMilli()) }
	// before returns the lease field of the version before that, for a
	// lease of length d taken at server time at.
	before := func(at time.Time, d time.Duration) string {
		return fmt.Sprintf("%d:%d:%d", at.Unix(), at.Nanosecond()/1000, d.Milliseconds())
	}
	inProgress := func(lease string) (key, rkey string) {
		key = randKey()
		rkey = s.RecordKey(key)
		c.HSet(ctx, rkey, "state", "in_progress", "token", "old", "fp", req(key, "x").Fingerprint, "epoch", 3, "lease", lease)
		c.PExpire(ctx, rkey, time.Hour)
		return key, rkey
	}
	complete := func() (key, rkey string) {
		key = randKey()
		rkey = s.RecordKey(key)
		c.HSet(ctx, rkey, "state", "complete", "token", "old", "fp", req(key, "x").Fingerprint, "epoch", 2,
			"lease", endsIn(-time.Minute), "meta", meta, "body", sampleResponse().Body)
		c.PExpire(ctx, rkey, time.Hour)
		return key, rkey
	}
	other := func(key, token string) idempotency.AcquireRequest {
		r := req(key, token)
		r.Fingerprint = "another request"
		return r
	}
	// fencedLost: the current store's complete, extend and release by
	// token find the record held by someone else (a record of the previous
	// layout is held by an instance of the previous version).
	fencedLost := func(t *testing.T, key, token string) {
		t.Helper()
		for name, err := range map[string]error{
			"Complete": s.Complete(ctx, key, token, sampleResponse(), time.Hour),
			"Extend":   s.Extend(ctx, key, token, time.Minute),
			"Release":  s.Release(ctx, key, token),
		} {
			if !errors.Is(err, idempotency.ErrLeaseLost) {
				t.Errorf("%s(%s) = %v, want ErrLeaseLost", name, token, err)
			}
		}
	}
	same := func(t *testing.T, rkey string, was map[string]string) {
		t.Helper()
		if now := c.HGetAll(ctx, rkey).Val(); !reflect.DeepEqual(now, was) {
			t.Errorf("record changed: %q -> %q", was, now)
		}
		if pttl := c.PTTL(ctx, rkey).Val(); pttl <= 59*time.Minute || pttl > time.Hour {
			t.Errorf("record's expiry changed: PTTL %v", pttl)
		}
	}

	t.Run("in flight", func(t *testing.T) {
		key, rkey := inProgress(endsIn(time.Minute))
		a := mustAcquire(t, s, req(key, "dup"), idempotency.InFlight)
		if a.Epoch != 3 || a.LeaseRemaining <= 55*time.Second || a.LeaseRemaining > time.Minute {
			t.Errorf("in flight: %+v, want epoch 3 and about 1m left", a)
		}
		// Marked in the previous layout, for the holder's complete.
		if v := c.HGet(ctx, rkey, "watched").Val(); v != "1" {
			t.Errorf("watched = %q after an in-flight answer, want 1", v)
		}
		was := c.HGetAll(ctx, rkey).Val()
		mustAcquire(t, s, other(key, "dup"), idempotency.Mismatch)
		mustAcquire(t, s, req(key, "dup2"), idempotency.InFlight)
		fencedLost(t, key, "dup")
		if _, stop, err := s.Watch(ctx, key); err != nil {
			t.Errorf("Watch: %v", err)
		} else {
			stop()
		}
		same(t, rkey, was)
	})

	t.Run("in flight under the lease form before", func(t *testing.T) {
		// A minute's lease taken at .999999 s into the second 20 s before
		// the server's current one: the microseconds count, rounded down to
		// the millisecond, so the lease ends at .999 s.
		now := serverNow()
		taken := time.Unix(now.Unix()-20, 999_999_000)
		field := before(taken, time.Minute)
		key, rkey := inProgress(field)
		end := taken.Truncate(time.Millisecond).Add(time.Minute)
		// The script reads the clock in whole milliseconds, rounded down.
		from := serverNow().Truncate(time.Millisecond)
		a := mustAcquire(t, s, req(key, "dup"), idempotency.InFlight)
		to := serverNow().Truncate(time.Millisecond)
		if a.Epoch != 3 || a.LeaseRemaining > end.Sub(from) || a.LeaseRemaining < end.Sub(to) {
			t.Errorf("in flight under %q: %+v; want epoch 3 and between %v and %v left", field, a, end.Sub(to), end.Sub(from))
		}
		if got := c.HGet(ctx, rkey, "lease").Val(); got != field {
			t.Errorf("an in-flight answer changed the lease field: %q -> %q", field, got)
		}
	})

	// A steal rewrites the record in the current layout: the head alone,
	// with the watched mark of the previous layout carried over.
	for name, lease := range map[string]string{
		"steal":                             endsIn(-time.Hour),
		"steal under the lease form before": before(serverNow().Add(-time.Hour), time.Second),
	} {
		t.Run(name, func(t *testing.T) {
			key, rkey := inProgress(lease)
			c.HSet(ctx, rkey, "watched", "1")
			if a := mustAcquire(t, s, req(key, "thief"), idempotency.Stolen); a.Epoch != 4 {
				t.Errorf("steal at epoch 3 gave epoch %d, want 4", a.Epoch)
			}
			h := c.HGetAll(ctx, rkey).Val()
			hd, err := parseHead(h["h"])
			if len(h) != 1 || err != nil || hd != (head{'P', "thief", 4, hd.leaseEnd, req(key, "x").Fingerprint}) {
				t.Fatalf("stolen record %q (%+v, %v), want only the head, P, thief, epoch 4", h, hd, err)
			}
			wantLeaseLeft(t, c, rkey, req(key, "thief").Lease)
			mustAcquire(t, s, req(key, "old"), idempotency.InFlight)
			if err := s.Extend(ctx, key, "thief", time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := s.Complete(ctx, key, "thief", sampleResponse(), time.Hour); err != nil {
				t.Fatal(err)
			}
			a := mustAcquire(t, s, req(key, "dup"), idempotency.Completed)
			if !reflect.DeepEqual(a.Response, sampleResponse()) {
				t.Errorf("replayed %+v", a.Response)
			}
		})
	}

	// The holder's retry (a token the current store never gives a record of
	// the previous layout: shown all the same) keeps the epoch, rewrites the
	// record in the current layout, and renews the lease to run at least
	// its length from now, never shortening it.
	for name, c2 := range map[string]struct {
		lease string
		left  time.Duration
	}{
		"holder's retry, a second left":              {endsIn(time.Second), 10 * time.Second},
		"holder's retry, run out":                    {before(serverNow().Add(-time.Hour), time.Second), 10 * time.Second},
		"holder's retry, half an hour left":          {endsIn(30 * time.Minute), 30 * time.Minute},
		"holder's retry, past the key's expiry (2h)": {endsIn(2 * time.Hour), 2 * time.Hour},
	} {
		t.Run(name, func(t *testing.T) {
			key, rkey := inProgress(c2.lease)
			if a := mustAcquire(t, s, req(key, "old"), idempotency.Stolen); a.Epoch != 3 {
				t.Errorf("holder's retry: epoch %d, want 3", a.Epoch)
			}
			h := c.HGetAll(ctx, rkey).Val()
			if hd, err := parseHead(h["h"]); len(h) != 1 || err != nil || hd.state != 'p' || hd.token != "old" || hd.epoch != 3 {
				t.Fatalf("record after the holder's retry: %q (%+v, %v)", h, hd, err)
			}
			wantLeaseLeft(t, c, rkey, c2.left)
			if pttl := c.PTTL(ctx, rkey).Val(); pttl < c2.left-5*time.Second || pttl > max(c2.left, time.Hour) {
				t.Errorf("PTTL %v", pttl)
			}
			if err := s.Complete(ctx, key, "old", sampleResponse(), time.Hour); err != nil {
				t.Fatal(err)
			}
		})
	}

	t.Run("complete", func(t *testing.T) {
		key, rkey := complete()
		was := c.HGetAll(ctx, rkey).Val()
		a := mustAcquire(t, s, req(key, "dup"), idempotency.Completed)
		if !reflect.DeepEqual(a.Response, sampleResponse()) || a.ExpiresIn != 0 {
			t.Errorf("replayed %+v, ExpiresIn %v; want %+v, 0 (not asked for)", a.Response, a.ExpiresIn, sampleResponse())
		}
		r := req(key, "dup")
		r.WantExpiresIn = true
		a = mustAcquire(t, s, r, idempotency.Completed)
		if !reflect.DeepEqual(a.Response, sampleResponse()) {
			t.Errorf("replayed %+v, want %+v", a.Response, sampleResponse())
		}
		if a.ExpiresIn <= 59*time.Minute || a.ExpiresIn > time.Hour {
			t.Errorf("ExpiresIn = %v, want about 1h", a.ExpiresIn)
		}
		mustAcquire(t, s, other(key, "dup"), idempotency.Mismatch)
		fencedLost(t, key, "dup")
		fencedLost(t, key, "old")
		same(t, rkey, was)
		// Watch marks it as the previous version did.
		if _, stop, err := s.Watch(ctx, key); err != nil {
			t.Errorf("Watch: %v", err)
		} else {
			stop()
		}
		if v := c.HGet(ctx, rkey, "watched").Val(); v != "1" {
			t.Errorf("watched = %q after Watch, want 1", v)
		}
	})
}

// The scripts of the previous version, as it sends them.
var (
	//go:embed testdata/previous/acquire.lua
	previousAcquireSrc string
	//go:embed testdata/previous/complete.lua
	previousCompleteSrc string
	//go:embed testdata/previous/watch.lua
	previousWatchSrc string
)

// TestPreviousVersionOnCurrentRecords: an instance of the previous version
// reads the current layout as a corrupt record (its requests answer 500
// record_unreadable, and no handler runs), changes nothing, and loses the
// lease of a record the current store stole from it.
func TestPreviousVersionOnCurrentRecords(t *testing.T) {
	c := newClient(t)
	s := newStore(t, c)
	acquire := redis.NewScript(previousAcquireSrc)
	complete := redis.NewScript(previousCompleteSrc[len("#!lua flags=allow-oom"):])
	watch := redis.NewScript(previousWatchSrc)
	previousAcquire := func(t *testing.T, key, token string) []any {
		t.Helper()
		reply, err := acquire.Run(ctx, c, []string{s.RecordKey(key)}, token, req(key, "x").Fingerprint, 10_000, 3_600_000).Slice()
		if err != nil {
			t.Fatal(err)
		}
		return reply
	}
	wantCorrupt := func(t *testing.T, key string) {
		t.Helper()
		rkey := s.RecordKey(key)
		was := c.HGetAll(ctx, rkey).Val()
		for _, token := range []string{"dup", "t1"} {
			if reply := previousAcquire(t, key, token); len(reply) == 0 || reply[0] != int64(-1) {
				t.Errorf("previous acquire(%s) = %v, want {-1, ...}", token, reply)
			}
		}
		if now := c.HGetAll(ctx, rkey).Val(); !reflect.DeepEqual(now, was) {
			t.Errorf("record changed: %q -> %q", was, now)
		}
	}

	key := randKey()
	mustAcquire(t, s, req(key, "t1"), idempotency.Acquired)
	wantCorrupt(t, key)
	// Its waiter finds no record to mark; its re-check is the acquire above.
	if reply, err := watch.Run(ctx, c, []string{s.RecordKey(key)}).Slice(); err != nil || reply[0] != int64(0) {
		t.Errorf("previous watch = %v, %v; want {0}", reply, err)
	}
	if err := s.Complete(ctx, key, "t1", sampleResponse(), time.Hour); err != nil {
		t.Fatal(err)
	}
	wantCorrupt(t, key)

	// A record of the previous version, stolen by the current one: the
	// previous holder's complete finds its lease lost.
	key = randKey()
	rkey := s.RecordKey(key)
	if reply := previousAcquire(t, key, "old"); reply[0] != int64(1) {
		t.Fatalf("previous acquire of a new key = %v", reply)
	}
	c.HSet(ctx, rkey, "lease", "1") // ran out long ago
	mustAcquire(t, s, req(key, "thief"), idempotency.Stolen)
	reply, err := complete.Run(ctx, c, []string{rkey}, "old", 3_600_000, "meta", "body", s.Channel(key)).Slice()
	if err != nil || reply[0] != int64(0) {
		t.Errorf("previous complete by the robbed holder = %v, %v; want {0}", reply, err)
	}
	if recordState(c, rkey) != "in_progress" {
		t.Errorf("record %q after the refused complete", c.HGetAll(ctx, rkey).Val())
	}
}
