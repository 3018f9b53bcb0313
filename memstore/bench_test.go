package memstore_test

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/memstore"
)

var benchResponse = &idempotency.Response{
	Status: http.StatusCreated,
	Header: http.Header{"Content-Type": {"application/json"}},
	Body:   []byte(`{"id":"pay_1"}`),
}

// benchKeys returns n storage keys shaped like the middleware's.
func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%064x", i)
	}
	return keys
}

// BenchmarkAcquireComplete measures the first execution of a request:
// Acquire of a new key, then Complete. Keys cycle through a pool whose
// records have expired by the time they come round again (TTL 1ns), so the
// store stays at a steady size as it would under its sweep.
func BenchmarkAcquireComplete(b *testing.B) {
	const pool = 1 << 16
	keys := benchKeys(pool)
	run := func(b *testing.B, s *memstore.Store, keys []string, next func() int) {
		ctx := context.Background()
		req := idempotency.AcquireRequest{Token: "t", Fingerprint: "fp", Lease: 10 * time.Second, TTL: time.Nanosecond}
		i := next()
		req.Key = keys[i%len(keys)]
		a, err := s.Acquire(ctx, req)
		if err != nil || a.Outcome != idempotency.Acquired {
			b.Fatalf("Acquire: %+v, %v", a, err)
		}
		if err := s.Complete(ctx, req.Key, req.Token, benchResponse, time.Nanosecond); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("Serial", func(b *testing.B) {
		s := memstore.New()
		defer s.Close()
		i := 0
		next := func() int { i++; return i }
		b.ReportAllocs()
		for b.Loop() {
			run(b, s, keys, next)
		}
	})
	b.Run("Parallel", func(b *testing.B) {
		s := memstore.New()
		defer s.Close()
		var worker atomic.Int32
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			// Each goroutine takes its own slice of the pool, so no two
			// goroutines hold the same key at once.
			w := int(worker.Add(1)) - 1
			parts := 4 * runtime.GOMAXPROCS(0)
			mine := keys[w%parts*(pool/parts) : (w%parts+1)*(pool/parts)]
			i := 0
			next := func() int { i++; return i }
			for pb.Next() {
				run(b, s, mine, next)
			}
		})
	})
}

// BenchmarkShardLocks is a control for the parallel benchmarks above, not
// a benchmark of the store: each goroutine only locks and unlocks padded
// mutexes chosen at random among as many as the store has shards. It is
// the least that a store taking a shard's lock on every call pays when a
// lock's cache line moves between cores, so its throughput from 1 to 2 CPUs
// shows what the machine lets such a store gain.
func BenchmarkShardLocks(b *testing.B) {
	var locks [64]struct {
		sync.Mutex
		_ [120]byte
	}
	var worker atomic.Uint64
	b.RunParallel(func(pb *testing.PB) {
		x := worker.Add(1) * 0x9e3779b97f4a7c15
		for pb.Next() {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			l := &locks[x%uint64(len(locks))]
			l.Lock()
			l.Unlock() // an empty critical section: the lock alone is measured
		}
	})
}

// BenchmarkAcquireReplay measures a duplicate of a completed request:
// Acquire of a COMPLETE key. Parallel spreads the duplicates over many keys;
// ParallelSameKey sends all of them to one key.
func BenchmarkAcquireReplay(b *testing.B) {
	const n = 1024
	keys := benchKeys(n)
	setup := func(b *testing.B) *memstore.Store {
		s := memstore.New()
		ctx := context.Background()
		for _, k := range keys {
			req := idempotency.AcquireRequest{Key: k, Token: "t", Fingerprint: "fp", Lease: time.Hour, TTL: time.Hour}
			if _, err := s.Acquire(ctx, req); err != nil {
				b.Fatal(err)
			}
			if err := s.Complete(ctx, k, "t", benchResponse, time.Hour); err != nil {
				b.Fatal(err)
			}
		}
		return s
	}
	replay := func(b *testing.B, s *memstore.Store, key string) {
		a, err := s.Acquire(context.Background(), idempotency.AcquireRequest{
			Key: key, Token: "dup", Fingerprint: "fp", Lease: time.Hour, TTL: time.Hour,
		})
		if err != nil || a.Outcome != idempotency.Completed {
			b.Fatalf("Acquire: %+v, %v", a, err)
		}
	}
	b.Run("Serial", func(b *testing.B) {
		s := setup(b)
		defer s.Close()
		i := 0
		b.ReportAllocs()
		for b.Loop() {
			replay(b, s, keys[i%n])
			i++
		}
	})
	b.Run("Parallel", func(b *testing.B) {
		s := setup(b)
		defer s.Close()
		var worker atomic.Int32
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := int(worker.Add(1)) * 97
			for pb.Next() {
				replay(b, s, keys[i%n])
				i++
			}
		})
	})
	b.Run("ParallelSameKey", func(b *testing.B) {
		s := setup(b)
		defer s.Close()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				replay(b, s, keys[0])
			}
		})
	})
}

// BenchmarkRecordMemory reports the heap held per COMPLETE record with a
// body of 0 B, 1 KiB and 16 KiB and a Content-Type and a Location header,
// as the middleware would store it, and the part of it beyond the body
// (key, token, fingerprint, record, status and headers): that part stays
// the same whatever the body, so a record costs its body plus a constant.
// It also reports what the store counts per record against its byte bound
// (counted-bytes/record, see WithMaxBytes), to compare with the heap. The
// handler's bodies are dropped once stored: the store keeps copies.
func BenchmarkRecordMemory(b *testing.B) {
	for _, size := range []int{0, 1 << 10, 16 << 10} {
		b.Run(fmt.Sprintf("body=%d", size), func(b *testing.B) { recordMemory(b, size) })
	}
}

func recordMemory(b *testing.B, bodySize int) {
	const records = 20_000
	ctx := context.Background()
	var perRecord, payload, counted float64
	for b.Loop() {
		runtime.GC()
		var before, after, afterPayload runtime.MemStats
		bodies := make([][]byte, records)
		resps := make([]*idempotency.Response, records)
		runtime.ReadMemStats(&before)
		// The bodies alone, as the handler's recorder would leave them.
		for i := range bodies {
			bodies[i] = make([]byte, bodySize)
		}
		runtime.GC()
		runtime.ReadMemStats(&afterPayload)
		for i := range resps {
			resps[i] = &idempotency.Response{
				Status: http.StatusCreated,
				Header: http.Header{
					"Content-Type": {"application/json"},
					"Location":     {"/payments/" + strconv.Itoa(i)},
				},
				Body: bodies[i],
			}
		}
		s := memstore.New(memstore.WithMaxEntries(records), memstore.WithMaxBytes(1<<40))
		for i := range records {
			key := fmt.Sprintf("%064x", i)
			token := fmt.Sprintf("%032x", i)
			req := idempotency.AcquireRequest{Key: key, Token: token, Fingerprint: string(make([]byte, 32)), Lease: time.Hour, TTL: time.Hour}
			if _, err := s.Acquire(ctx, req); err != nil {
				b.Fatal(err)
			}
			if err := s.Complete(ctx, key, token, resps[i], time.Hour); err != nil {
				b.Fatal(err)
			}
		}
		clear(resps)
		clear(bodies)
		runtime.GC()
		runtime.ReadMemStats(&after)
		// Signed: with empty bodies the heap can shrink by a few bytes
		// between two readings.
		heap := func(m *runtime.MemStats) float64 { return float64(int64(m.HeapAlloc)) }
		perRecord = (heap(&after) - heap(&before)) / records
		payload = (heap(&afterPayload) - heap(&before)) / records
		counted = float64(s.Bytes()) / records
		if s.Len() != records {
			b.Fatalf("Len = %d, want %d", s.Len(), records)
		}
		runtime.KeepAlive(s)
		s.Close()
	}
	b.ReportMetric(perRecord, "bytes/record")
	b.ReportMetric(perRecord-payload, "overhead-bytes/record")
	b.ReportMetric(counted, "counted-bytes/record")
	b.ReportMetric(0, "ns/op")
}
