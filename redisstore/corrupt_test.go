package redisstore_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

// TestCorruptRecords plants values under record keys that are not records
// the store wrote: each Acquire must fail with ErrCorruptRecord, neither
// replaying nor granting a lease, and leave the value alone.
func TestCorruptRecords(t *testing.T) {
	c := newClient(t)
	s := newStore(t, c)
	fp := func(key string) string { return req(key, "x").Fingerprint }
	lease := fmt.Sprintf("%d:0:3600000", time.Now().Unix()) // ends in an hour
	validMeta := func() string {
		// A real meta block, taken from a completed record.
		key := randKey()
		mustAcquire(t, s, req(key, "t"), idempotency.Acquired)
		if err := s.Complete(ctx, key, "t", sampleResponse(), time.Hour); err != nil {
			t.Fatal(err)
		}
		return c.HGet(ctx, s.RecordKey(key), "meta").Val()
	}()

	cases := map[string]func(rkey, key string){
		"string value": func(rkey, _ string) { c.Set(ctx, rkey, "hello", 0) },
		"list value":   func(rkey, _ string) { c.RPush(ctx, rkey, "a") },
		"empty-ish hash": func(rkey, _ string) {
			c.HSet(ctx, rkey, "unrelated", "1")
		},
		"unknown state": func(rkey, key string) {
			c.HSet(ctx, rkey, "state", "failed", "fp", fp(key), "epoch", 1)
		},
		"no fingerprint": func(rkey, _ string) {
			c.HSet(ctx, rkey, "state", "complete", "epoch", 1, "meta", validMeta, "body", "")
		},
		"epoch not a number": func(rkey, key string) {
			c.HSet(ctx, rkey, "state", "in_progress", "token", "t", "fp", fp(key), "epoch", "one", "lease", lease)
		},
		"in progress without lease": func(rkey, key string) {
			c.HSet(ctx, rkey, "state", "in_progress", "token", "t", "fp", fp(key), "epoch", 1)
		},
		"in progress with a malformed lease": func(rkey, key string) {
			c.HSet(ctx, rkey, "state", "in_progress", "token", "t", "fp", fp(key), "epoch", 1, "lease", "soon")
		},
		"in progress with a lease in Unix milliseconds": func(rkey, key string) {
			c.HSet(ctx, rkey, "state", "in_progress", "token", "t", "fp", fp(key), "epoch", 1, "lease", time.Now().Add(time.Hour).UnixMilli())
		},
		"complete without meta": func(rkey, key string) {
			c.HSet(ctx, rkey, "state", "complete", "fp", fp(key), "epoch", 1, "body", "x")
		},
		"complete without body": func(rkey, key string) {
			c.HSet(ctx, rkey, "state", "complete", "fp", fp(key), "epoch", 1, "meta", validMeta)
		},
		"garbage meta": func(rkey, key string) {
			c.HSet(ctx, rkey, "state", "complete", "fp", fp(key), "epoch", 1, "meta", "\xde\xad\xbe\xef", "body", "x")
		},
		"truncated meta": func(rkey, key string) {
			c.HSet(ctx, rkey, "state", "complete", "fp", fp(key), "epoch", 1, "meta", validMeta[:len(validMeta)-3], "body", "x")
		},
		"unknown version": func(rkey, key string) {
			c.HSet(ctx, rkey, "state", "complete", "fp", fp(key), "epoch", 1, "meta", "\x09"+validMeta[1:], "body", "x")
		},
		"status out of range": func(rkey, key string) {
			c.HSet(ctx, rkey, "state", "complete", "fp", fp(key), "epoch", 1, "meta", "\x01\x63\x00\x00", "body", "x")
		},
	}
	for name, plant := range cases {
		t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
			key := randKey()
			rkey := s.RecordKey(key)
			plant(rkey, key)
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
			a, err := s.Acquire(ctx, req(key, "t2"))
			if !errors.Is(err, idempotency.ErrCorruptRecord) {
				t.Fatalf("Acquire = %+v, %v; want ErrCorruptRecord", a, err)
			}
			if !strings.Contains(err.Error(), rkey) {
				t.Errorf("error %q does not name the key", err)
			}
			if a.Outcome != 0 || a.Response != nil {
				t.Errorf("Acquire returned an outcome with the error: %+v", a)
			}
			if after := snapshot(); after != before {
				t.Errorf("Acquire changed the corrupt value: %q -> %q", before, after)
			}
		})
	}

	// Complete, Release and Extend on a foreign type refuse too.
	key := randKey()
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

// TestCorruptRecordOverHTTP: the middleware answers 500 and does not run
// the handler.
func TestCorruptRecordOverHTTP(t *testing.T) {
	c := newClient(t)
	s := newStore(t, c)
	var calls atomic.Int64
	srv := httptest.NewServer(idempotency.New(s)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
	})))
	defer srv.Close()
	c.Set(ctx, s.RecordKey(idempotency.StorageKey("", "k")), "garbage", 0)
	resp, _ := post(t, srv.URL, "k", "body")
	if resp.StatusCode != http.StatusInternalServerError || calls.Load() != 0 {
		t.Fatalf("status %d, handler ran %d times; want 500 and 0", resp.StatusCode, calls.Load())
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
