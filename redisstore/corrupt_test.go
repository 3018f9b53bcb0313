package redisstore_test

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/redisrecord"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/internal/wire"
	"github.com/go-idempotency/idempotency/redisstore"
)

// TestCorruptRecords plants values under record keys that are not records
// the store wrote: each Acquire, by another token and by the planted
// holder's, must fail with ErrCorruptRecord, neither replaying nor granting
// a lease, and leave the value and its expiry alone.
func TestCorruptRecords(t *testing.T) {
	c := newClient(t)
	s := newStore(t, c)
	fp := func(key string) string { return req(key, "x").Fingerprint }
	meta, err := wire.AppendMeta(nil, sampleResponse())
	if err != nil {
		t.Fatal(err)
	}
	validMeta := string(meta)

	// Records of the current layout: the head h (in progress: the record's
	// only field), and once complete the payload under "c" + fingerprint.
	// The in-progress ones ran out: a store trusting them would steal.
	ranOut := "1" // lease end: 1 ms into 1970
	cases := map[string]func(rkey, key string){
		"head with an unknown state": func(rkey, key string) {
			c.HSet(ctx, rkey, "h", "x1:t1:"+ranOut+":"+fp(key))
		},
		"complete head without its payload": func(rkey, key string) {
			c.HSet(ctx, rkey, "h", "c1:t1:1:"+fp(key))
		},
		"complete head with the payload under another name": func(rkey, key string) {
			c.HSet(ctx, rkey, "h", "c1:t1:1:"+fp(key), "c", "\x01"+validMeta[:1]+"x")
		},
		"head cut short": func(rkey, key string) {
			c.HSet(ctx, rkey, "h", "p1:t1:"+ranOut)
		},
		"head without token": func(rkey, key string) {
			c.HSet(ctx, rkey, "h", "p1:"+ranOut+":"+fp(key))
		},
		"head with a token longer than itself": func(rkey, key string) {
			c.HSet(ctx, rkey, "h", "p999:t1:"+ranOut+":"+fp(key))
		},
		"payload that is not one": func(rkey, key string) {
			c.HSet(ctx, rkey, "h", "c1:t1:1:"+fp(key), "c"+fp(key), "\xff\xff\xff")
		},
		"payload with a meta length past its end": func(rkey, key string) {
			c.HSet(ctx, rkey, "h", "c1:t1:1:"+fp(key), "c"+fp(key), "\x7f"+validMeta)
		},
		"payload with a truncated meta block": func(rkey, key string) {
			c.HSet(ctx, rkey, "h", "c1:t1:1:"+fp(key), "c"+fp(key), string(rune(len(validMeta)-3))+validMeta[:len(validMeta)-3])
		},
		"payload whose meta length overflows 64 bits": func(rkey, key string) {
			c.HSet(ctx, rkey, "h", "c1:t1:1:"+fp(key), "c"+fp(key), strings.Repeat("\xff", 9)+"\x7f"+validMeta)
		},
		"empty payload": func(rkey, key string) {
			c.HSet(ctx, rkey, "h", "c1:t1:1:"+fp(key), "c"+fp(key), "")
		},
	}
	for _, tl := range []string{"0", "01", "1234567890", "", "x", "-1", "+1", " 1", "1e0"} {
		cases[fmt.Sprintf("head with token length %q", tl)] = func(rkey, key string) {
			c.HSet(ctx, rkey, "h", "p"+tl+":t1:"+ranOut+":"+fp(key))
		}
	}
	for _, epoch := range []string{
		"nan", "inf", "-inf", "9223372036854775808", "1e3", "0x10", " 1", "1 ", "1.5",
		"0", "-1", "+1", "01", "", "1000000000000000", "99999999999999999999",
	} {
		cases[fmt.Sprintf("head with epoch %q", epoch)] = func(rkey, key string) {
			c.HSet(ctx, rkey, "h", "p1:t"+epoch+":"+ranOut+":"+fp(key))
		}
		cases[fmt.Sprintf("complete head with epoch %q", epoch)] = func(rkey, key string) {
			c.HSet(ctx, rkey, "h", "c1:t"+epoch+":0:"+fp(key))
		}
	}
	for _, end := range []string{
		"nan", "inf", "1e3", "0x10", " 1", "1 ", "1.5", "-1", "+1", "0", "01", "00", "", "1000000000000000", strings.Repeat("9", 400),
	} {
		cases[fmt.Sprintf("head with lease end %q", end)] = func(rkey, key string) {
			c.HSet(ctx, rkey, "h", "p1:t1:"+end+":"+fp(key))
		}
	}

	// Values that are not records of this layout at all.
	for name, plant := range map[string]func(rkey, key string){
		"string value":        func(rkey, _ string) { c.Set(ctx, rkey, "hello", 0) },
		"list value":          func(rkey, _ string) { c.RPush(ctx, rkey, "a") },
		"hash without a head": func(rkey, _ string) { c.HSet(ctx, rkey, "unrelated", "1") },
		"hash without a head, with a payload": func(rkey, key string) {
			c.HSet(ctx, rkey, redisrecord.PayloadField(fp(key)), "\x01"+validMeta)
		},
	} {
		cases[name] = plant
	}
	for name, plant := range cases {
		t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
			key := randKey()
			rkey := s.RecordKey(key)
			plant(rkey, key)
			// A planted expiry no script would set: a write to the key's
			// expiry shows.
			const plantedTTL = 2 * time.Hour
			if !c.PExpire(ctx, rkey, plantedTTL).Val() {
				t.Fatal("PEXPIRE of the planted value failed")
			}
			snapshot := func() string {
				switch typ := c.Type(ctx, rkey).Val(); typ {
				case "hash":
					return fmt.Sprint(c.HGetAll(ctx, rkey).Val())
				case "string":
					return c.Get(ctx, rkey).Val()
				default:
					return typ + fmt.Sprint(c.LRange(ctx, rkey, 0, -1).Val())
				}
			}
			before := snapshot()
			for _, token := range []string{"t2", "t"} {
				a, err := s.Acquire(ctx, req(key, token))
				if !errors.Is(err, idempotency.ErrCorruptRecord) {
					t.Fatalf("Acquire(%s) = %+v, %v; want ErrCorruptRecord", token, a, err)
				}
				if !strings.Contains(err.Error(), rkey) {
					t.Errorf("error %q does not name the key", err)
				}
				if a.Outcome != 0 || a.Response != nil {
					t.Errorf("Acquire(%s) returned an outcome with the error: %+v", token, a)
				}
				if after := snapshot(); after != before {
					t.Fatalf("Acquire(%s) changed the corrupt value: %q -> %q", token, before, after)
				}
				if pttl := c.PTTL(ctx, rkey).Val(); pttl > plantedTTL || pttl < plantedTTL-time.Minute {
					t.Fatalf("Acquire(%s) changed the key's expiry: PTTL %v, planted %v", token, pttl, plantedTTL)
				}
			}
		})
	}

	// An in-progress record whose key has no expiry (made persistent by
	// hand) keeps its lease end in its head: judged by it, and a steal
	// gives the key an expiry again.
	key := randKey()
	rkey := s.RecordKey(key)
	c.HSet(ctx, rkey, "h", fmt.Sprintf("p1:t1:%d:%s", time.Now().Add(time.Hour).UnixMilli(), fp(key)))
	if a := mustAcquire(t, s, req(key, "t2"), idempotency.InFlight); a.LeaseRemaining < 59*time.Minute || a.LeaseRemaining > time.Hour {
		t.Errorf("in flight on a key without expiry: %+v, want about an hour left", a)
	}
	c.HSet(ctx, rkey, "h", "p1:t1:"+ranOut+":"+fp(key))
	if a := mustAcquire(t, s, req(key, "t2"), idempotency.Stolen); a.Epoch != 2 {
		t.Errorf("steal of a key without expiry: %+v, want epoch 2", a)
	}
	if pttl := c.PTTL(ctx, rkey).Val(); pttl <= 0 {
		t.Errorf("stolen key without expiry: PTTL %v, want the new lease's expiry", pttl)
	}

	// Complete, Release and Extend on a foreign type refuse too.
	key = randKey()
	c.Set(ctx, s.RecordKey(key), "hello", 0)
	for name, err := range map[string]error{
		"Complete": s.Complete(ctx, key, "t", sampleResponse(), time.Hour),
		"Release":  s.Release(ctx, key, "t"),
		"Extend":   s.Extend(ctx, key, "t", time.Second),
	} {
		if !errors.Is(err, idempotency.ErrCorruptRecord) {
			t.Errorf("%s on a string = %v, want ErrCorruptRecord", name, err)
		}
	}
	if c.Get(ctx, s.RecordKey(key)).Val() != "hello" {
		t.Error("foreign value changed")
	}
}

// TestExtremeRecords: the largest numbers a record may hold are read, and
// reported without overflow.
func TestExtremeRecords(t *testing.T) {
	c := newClient(t)
	s := newStore(t, c)
	fp := func(key string) string { return req(key, "x").Fingerprint }
	plant := func(key string, epoch int64, leaseEnd int64) string {
		rkey := s.RecordKey(key)
		hd := redisrecord.Head{State: redisrecord.InProgress, Token: "t", Epoch: epoch, LeaseEnd: leaseEnd, Fingerprint: fp(key)}
		c.HSet(ctx, rkey, redisrecord.HeadField, hd.String())
		c.PExpire(ctx, rkey, time.Hour)
		return rkey
	}

	// The epoch at its largest, with a live lease.
	key := randKey()
	plant(key, redisrecord.MaxEpoch, time.Now().Add(time.Hour).UnixMilli())
	a := mustAcquire(t, s, req(key, "t2"), idempotency.InFlight)
	if a.Epoch != redisrecord.MaxEpoch || a.LeaseRemaining <= 59*time.Minute || a.LeaseRemaining > time.Hour {
		t.Errorf("in flight at the largest epoch: %+v", a)
	}
	if a = mustAcquire(t, s, req(key, "t"), idempotency.Stolen); a.Epoch != redisrecord.MaxEpoch {
		t.Errorf("holder's retry at the largest epoch: %+v", a)
	}

	// A steal would take the epoch past 15 digits: refused, nothing
	// written. The holder's retry still renews its lease, which ran out in
	// 1970.
	key = randKey()
	rkey := plant(key, redisrecord.MaxEpoch, 1)
	before := c.HGetAll(ctx, rkey).Val()
	if a, err := s.Acquire(ctx, req(key, "t2")); !errors.Is(err, idempotency.ErrCorruptRecord) {
		t.Errorf("steal at the largest epoch = %+v, %v; want ErrCorruptRecord", a, err)
	}
	if after := c.HGetAll(ctx, rkey).Val(); !reflect.DeepEqual(after, before) {
		t.Errorf("refused steal changed the record: %v -> %v", before, after)
	}
	mustAcquire(t, s, req(key, "t"), idempotency.Stolen)
	wantLeaseLeft(t, c, rkey, req(key, "t").Lease)
	mustAcquire(t, s, req(key, "t2"), idempotency.InFlight)

	// The latest lease end read, 15 digits (the year 33658): far more than
	// a Duration holds.
	key = randKey()
	plant(key, 7, redisrecord.MaxEpoch)
	if a = mustAcquire(t, s, req(key, "t2"), idempotency.InFlight); a.Epoch != 7 || a.LeaseRemaining != math.MaxInt64 {
		t.Errorf("in flight under the latest lease end: %+v, want LeaseRemaining %v", a, time.Duration(math.MaxInt64))
	}
}

// TestCorruptRecordOverHTTP: the middleware answers 500 record_unreadable
// and does not run the handler.
func TestCorruptRecordOverHTTP(t *testing.T) {
	c := newClient(t)
	s := newStore(t, c)
	var calls atomic.Int64
	srv := httptest.NewServer(idempotency.New(s)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()
	wantUnreadable := func(key string) {
		t.Helper()
		before := calls.Load()
		resp, body := post(t, srv.URL, key, "body")
		if resp.StatusCode != http.StatusInternalServerError || calls.Load() != before {
			t.Fatalf("key %s: status %d, handler ran %d more times; want 500 and 0", key, resp.StatusCode, calls.Load()-before)
		}
		if !strings.Contains(string(body), `"code":"record_unreadable"`) {
			t.Fatalf("key %s: problem %s, want code record_unreadable", key, body)
		}
	}

	c.Set(ctx, s.RecordKey(idempotency.StorageKey("", "k")), "garbage", 0)
	wantUnreadable("k")

	// Records the middleware made, then changed: back to in progress, with
	// an epoch of 2^63 (which Lua's tonumber accepts) and a lease that ran
	// out; and a completed one whose payload is cut short.
	for key, change := range map[string]func(rkey string, hd redisrecord.Head){
		"k-steal": func(rkey string, hd redisrecord.Head) {
			c.HDel(ctx, rkey, redisrecord.PayloadField(hd.Fingerprint))
			c.HSet(ctx, rkey, redisrecord.HeadField, "p4:gone9223372036854775808:99999999999999:"+hd.Fingerprint)
		},
		"k-replay": func(rkey string, hd redisrecord.Head) {
			p := c.HGet(ctx, rkey, redisrecord.PayloadField(hd.Fingerprint)).Val()
			c.HSet(ctx, rkey, redisrecord.PayloadField(hd.Fingerprint), p[:2])
		},
	} {
		if resp, _ := post(t, srv.URL, key, "body"); resp.StatusCode != http.StatusCreated {
			t.Fatalf("key %s: first request: status %d", key, resp.StatusCode)
		}
		rkey := s.RecordKey(idempotency.StorageKey("", key))
		// The response is sent before the record is completed.
		if !redistest.WaitFor(5*time.Second, func() bool { return recordState(c, rkey) == "complete" }) {
			t.Fatalf("key %s: record not completed: %v", key, c.HGetAll(ctx, rkey).Val())
		}
		change(rkey, head(t, c, rkey))
		before := c.HGetAll(ctx, rkey).Val()
		wantUnreadable(key)
		if after := c.HGetAll(ctx, rkey).Val(); !reflect.DeepEqual(after, before) {
			t.Fatalf("key %s: record changed: %v -> %v", key, before, after)
		}
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2 (the first requests)", n)
	}
}

// TestHugeLuaNumbersInReplies: Redis turns a Lua number into an integer
// reply by truncation, so an epoch or a remaining lease far out of range
// arrives as some int64; the reply parsers refuse it or saturate instead
// of trusting it.
func TestHugeLuaNumbersInReplies(t *testing.T) {
	c := newClient(t)
	reply, err := c.Eval(ctx, "return {1e300, -1e300, 2^63, 0/0, 1/0, 2^53, 1e15 - 1}", nil).Slice()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if v, ok := redisstore.EpochAt(reply, i); ok {
			t.Errorf("element %d (%v) accepted as epoch %d", i, reply[i], v)
		}
	}
	if v, ok := redisstore.EpochAt(reply, 5); ok {
		t.Errorf("2^53 accepted as epoch %d: above the 15-digit bound", v)
	}
	if v, ok := redisstore.EpochAt(reply, 6); !ok || v != redisrecord.MaxEpoch {
		t.Errorf("EpochAt(1e15 - 1) = %d, %v; want %d", v, ok, int64(redisrecord.MaxEpoch))
	}
	for _, ms := range []int64{math.MaxInt64, math.MaxInt64/int64(time.Millisecond) + 1} {
		if d := redisstore.MsDuration(ms); d != math.MaxInt64 {
			t.Errorf("MsDuration(%d) = %v, want the largest Duration", ms, d)
		}
	}
	if d := redisstore.MsDuration(1500); d != 1500*time.Millisecond {
		t.Errorf("MsDuration(1500) = %v", d)
	}
}

// TestStoreFull: a server at maxmemory with noeviction refuses new records;
// Acquire reports ErrStoreFull and the middleware answers 503.
func TestStoreFull(t *testing.T) {
	c := newClient(t)
	if !privateServer() {
		t.Skip("changes maxmemory: needs a private server, not REDIS_ADDR")
	}
	s := newStore(t, c)
	if err := c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	_, err := s.Acquire(ctx, req(randKey(), "t"))
	if !errors.Is(err, idempotency.ErrStoreFull) {
		t.Fatalf("Acquire at maxmemory = %v, want ErrStoreFull", err)
	}
	srv := httptest.NewServer(idempotency.New(s)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("handler ran with a full store")
	})))
	defer srv.Close()
	if resp, _ := post(t, srv.URL, "k", "b"); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503", resp.StatusCode)
	}
	if err := c.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, s, req(randKey(), "t"), idempotency.Acquired)
}
