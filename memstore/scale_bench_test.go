package memstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/memstore"
)

// keyCounts are the store sizes of BenchmarkKeyCount.
var keyCounts = []int{1_000, 10_000, 100_000, 1_000_000}

// BenchmarkKeyCount measures the cost of a request's store operations as
// the number of live records grows from 10^3 to 10^6: Replay is Acquire of
// a COMPLETE record picked at random among them, FirstExecution is Acquire
// of a new key then Complete. The first executions cycle through 1024 keys
// whose records expire at once (TTL 1ns) and are reused in place, so the
// store keeps its size. Records hold a 14-byte body.
func BenchmarkKeyCount(b *testing.B) {
	ctx := context.Background()
	for _, n := range keyCounts {
		// A million records of this size hold more than the default byte
		// bound; the benchmark measures time, not the bound.
		s := memstore.New(memstore.WithMaxEntries(n+2048), memstore.WithMaxBytes(1<<40))
		keys := benchKeys(n)
		for _, k := range keys {
			req := idempotency.AcquireRequest{Key: k, Token: "t", Fingerprint: "fp", Lease: time.Hour, TTL: time.Hour}
			if _, err := s.Acquire(ctx, req); err != nil {
				b.Fatal(err)
			}
			if err := s.Complete(ctx, k, "t", benchResponse, time.Hour); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(fmt.Sprintf("Replay/keys=%d", n), func(b *testing.B) {
			req := idempotency.AcquireRequest{Token: "dup", Fingerprint: "fp", Lease: time.Hour, TTL: time.Hour}
			x := uint64(0x9e3779b97f4a7c15)
			b.ReportAllocs()
			for b.Loop() {
				x ^= x << 13
				x ^= x >> 7
				x ^= x << 17
				req.Key = keys[x%uint64(n)]
				a, err := s.Acquire(ctx, req)
				if err != nil || a.Outcome != idempotency.Completed {
					b.Fatalf("Acquire: %+v, %v", a, err)
				}
			}
		})
		fresh := make([]string, 1024)
		for i := range fresh {
			fresh[i] = fmt.Sprintf("fresh-%058d", i)
		}
		b.Run(fmt.Sprintf("FirstExecution/keys=%d", n), func(b *testing.B) {
			req := idempotency.AcquireRequest{Token: "t", Fingerprint: "fp", Lease: 10 * time.Second, TTL: time.Nanosecond}
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				req.Key = fresh[i%len(fresh)]
				i++
				a, err := s.Acquire(ctx, req)
				if err != nil || a.Outcome != idempotency.Acquired {
					b.Fatalf("Acquire: %+v, %v", a, err)
				}
				if err := s.Complete(ctx, req.Key, req.Token, benchResponse, time.Nanosecond); err != nil {
					b.Fatal(err)
				}
			}
		})
		if got := s.Len(); got < n {
			b.Fatalf("store holds %d records, want at least %d", got, n)
		}
		s.Close()
	}
}
