package replaycache_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/memstore"
	"github.com/go-idempotency/idempotency/replaycache"
)

// BenchmarkAcquire measures a duplicate of a completed request with a
// 1 KiB body: from memstore alone, and from a cache in front of it. Serial
// cycles through 1,024 keys, SameKey sends every duplicate to one key from
// parallel goroutines.
func BenchmarkAcquire(b *testing.B) {
	const n = 1024
	resp := &idempotency.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/payments/123456"}},
		Body:   make([]byte, 1<<10),
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%064x", i)
	}
	setup := func(b *testing.B, cached bool) idempotency.Store {
		m := memstore.New()
		b.Cleanup(func() { m.Close() })
		var s idempotency.Store = m
		if cached {
			s = replaycache.New(m)
		}
		ctx := context.Background()
		for _, k := range keys {
			req := idempotency.AcquireRequest{Key: k, Token: "t", Fingerprint: "fp", Lease: time.Hour, TTL: time.Hour}
			if _, err := s.Acquire(ctx, req); err != nil {
				b.Fatal(err)
			}
			if err := s.Complete(ctx, k, "t", resp, time.Hour); err != nil {
				b.Fatal(err)
			}
			req.Token = "dup"
			if _, err := s.Acquire(ctx, req); err != nil { // fills the cache
				b.Fatal(err)
			}
		}
		return s
	}
	replay := func(b *testing.B, s idempotency.Store, key string) {
		a, err := s.Acquire(context.Background(), idempotency.AcquireRequest{
			Key: key, Token: "dup", Fingerprint: "fp", Lease: time.Hour, TTL: time.Hour,
		})
		if err != nil || a.Outcome != idempotency.Completed {
			b.Fatalf("Acquire: %+v, %v", a, err)
		}
	}
	for _, cached := range []bool{false, true} {
		name := "memstore"
		if cached {
			name = "cached"
		}
		b.Run(name+"/Serial", func(b *testing.B) {
			s := setup(b, cached)
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				replay(b, s, keys[i%n])
				i++
			}
		})
		b.Run(name+"/SameKey", func(b *testing.B) {
			s := setup(b, cached)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					replay(b, s, keys[0])
				}
			})
		})
	}
}
