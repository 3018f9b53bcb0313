// Package keycount is the shape of the stores' key-count benchmarks
// (pgbench, sqlitebench): the same request made in lockstep on stores that
// hold 10^3, 10^4, 10^5 and 10^6 live COMPLETE records, so that all sizes
// meet the same background load. Each store's benchmark fills its stores
// its own way (copies of the record Template stores) and hands them to
// Run.
package keycount

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

// Sizes are the numbers of live records, one store each, in the order Run
// takes its stores.
var Sizes = []int{1_000, 10_000, 100_000, 1_000_000}

// Response is the records' response: a 14-byte body.
var Response = &idempotency.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"pay_1"}`)}

// TemplateKey is the key of the record that Template stores, which a
// fill copies.
const TemplateKey = "template"

// Request is an Acquire of key with token, a 64-byte fingerprint and
// leases and TTLs of an hour.
func Request(key, token string) idempotency.AcquireRequest {
	return idempotency.AcquireRequest{Key: key, Token: token, Fingerprint: strings.Repeat("f", 64), Lease: time.Hour, TTL: time.Hour}
}

// Template stores Response under TemplateKey, COMPLETE for an hour.
func Template(ctx context.Context, s idempotency.Store) error {
	if _, err := s.Acquire(ctx, Request(TemplateKey, "t")); err != nil {
		return err
	}
	return s.Complete(ctx, TemplateKey, "t", Response, time.Hour)
}

// A Floor reads the stored response of key by hand in the store of
// Sizes[j], the least a replay does there, checking nothing (sqlitebench's
// is one SELECT by primary key).
type Floor func(ctx context.Context, j int, key string) error

// Run measures, on stores (one per size of Sizes, filled with copies of
// the template under key(0) .. key(size-1)): Replay, an Acquire of a copy
// picked at random; FirstExecution, an Acquire of a new key, then its
// Complete. Every op makes the request once on each store, in an order
// that rotates from op to op; it reports the mean time of a request at
// each size (ns/req@keys=N). With a floor, every Replay op also reads
// another copy picked at random through it, before or after the store's
// call by turns, and reports its mean time at each size
// (ns/floor@keys=N): whether a rise is the store's or its data's.
func Run(b *testing.B, stores []idempotency.Store, key func(n uint64) string, floor Floor) {
	ctx := context.Background()
	lockstep := func(b *testing.B, sides int, op func(side, j, i int) error) {
		total := make([][]time.Duration, sides)
		for side := range total {
			total[side] = make([]time.Duration, len(Sizes))
			for k := range Sizes { // untimed: opens the connections, prepares the statements
				if err := op(side, k, b.N+k); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			for k := range Sizes {
				j := (i + k) % len(Sizes)
				for n := range sides {
					side := (n + i) % sides
					start := time.Now()
					if err := op(side, j, i); err != nil {
						b.Fatal(err)
					}
					total[side][j] += time.Since(start)
				}
			}
		}
		b.StopTimer()
		for side, unit := range []string{"req", "floor"}[:sides] {
			for j, n := range Sizes {
				b.ReportMetric(float64(total[side][j])/float64(b.N), fmt.Sprintf("ns/%s@keys=%d", unit, n))
			}
		}
	}
	b.Run("Replay", func(b *testing.B) {
		x := uint64(0x9e3779b97f4a7c15) // xorshift: a record at random, without a lock
		pick := func(j int) string {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			return key(x % uint64(Sizes[j]))
		}
		sides := 1
		if floor != nil {
			sides = 2
		}
		lockstep(b, sides, func(side, j, _ int) error {
			if side == 1 {
				return floor(ctx, j, pick(j))
			}
			a, err := stores[j].Acquire(ctx, Request(pick(j), "dup"))
			if err == nil && a.Outcome != idempotency.Completed {
				err = fmt.Errorf("outcome %v, want a replay", a.Outcome)
			}
			return err
		})
	})
	b.Run("FirstExecution", func(b *testing.B) {
		prefix := strconv.FormatInt(time.Now().UnixNano(), 36) + "-"
		lockstep(b, 1, func(_, j, i int) error {
			key := prefix + strconv.Itoa(i)
			if _, err := stores[j].Acquire(ctx, Request(key, "t")); err != nil {
				return err
			}
			return stores[j].Complete(ctx, key, "t", Response, time.Millisecond)
		})
	})
}
