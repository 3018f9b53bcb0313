package pgbench

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/pgstore"
)

var ctx = context.Background()

// copySQL fills a table with copies of its record $1, under the keys
// k0 .. k<$2 - 1>.
const copySQL = `INSERT INTO %[1]s (key, state, token, fingerprint, epoch, lease_until, ttl_until, watched, status, headers, body, body_omitted, updated_at)
SELECT 'k' || g, state, token, fingerprint, epoch, lease_until, ttl_until, watched, status, headers, body, body_omitted, updated_at
FROM %[1]s, generate_series(0, $2::int - 1) AS g WHERE key = $1`

// BenchmarkKeyCount measures the cost of a request's store calls as the
// number of live records in PostgreSQL grows from 10^3 to 10^6, in
// lockstep: four tables of one database hold 10^3, 10^4, 10^5 and 10^6
// COMPLETE records, and every op makes the request once on each, in an
// order that rotates from op to op, so that all sizes meet the same
// background load. Replay is Acquire of a record picked at random;
// FirstExecution is Acquire of a new key, then Complete. Records hold a
// 14-byte body. It reports the mean time of a request at each size
// (ns/req@keys=N).
func BenchmarkKeyCount(b *testing.B) {
	pool := pgtest.Pool(b)
	sizes := []int{1_000, 10_000, 100_000, 1_000_000}
	resp := &idempotency.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"pay_1"}`)}
	req := func(key, token string) idempotency.AcquireRequest {
		return idempotency.AcquireRequest{Key: key, Token: token, Fingerprint: strings.Repeat("f", 64), Lease: time.Hour, TTL: time.Hour}
	}
	stores := make([]*pgstore.Store, len(sizes))
	for j, n := range sizes {
		table := fmt.Sprintf("records_%d", n)
		if err := pgstore.Migrate(ctx, pool, pgstore.WithTable(table)); err != nil {
			b.Fatal(err)
		}
		s := pgstore.New(pool, pgstore.WithTable(table))
		b.Cleanup(func() { s.Close() })
		if _, err := s.Acquire(ctx, req("template", "t")); err != nil {
			b.Fatal(err)
		}
		if err := s.Complete(ctx, "template", "t", resp, time.Hour); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, fmt.Sprintf(copySQL, s.Table()), "template", n); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "ANALYZE "+s.Table()); err != nil {
			b.Fatal(err)
		}
		stores[j] = s
	}
	lockstep := func(b *testing.B, op func(j, i int) error) {
		total := make([]time.Duration, len(sizes))
		for k := range sizes { // untimed: prepares the statements
			if err := op(k, b.N+k); err != nil {
				b.Fatal(err)
			}
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			for k := range sizes {
				j := (i + k) % len(sizes)
				start := time.Now()
				if err := op(j, i); err != nil {
					b.Fatal(err)
				}
				total[j] += time.Since(start)
			}
		}
		b.StopTimer()
		for j, n := range sizes {
			b.ReportMetric(float64(total[j])/float64(b.N), fmt.Sprintf("ns/req@keys=%d", n))
		}
	}
	b.Run("Replay", func(b *testing.B) {
		x := uint64(0x9e3779b97f4a7c15)
		lockstep(b, func(j, _ int) error {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			a, err := stores[j].Acquire(ctx, req("k"+strconv.FormatUint(x%uint64(sizes[j]), 10), "dup"))
			if err == nil && a.Outcome != idempotency.Completed {
				err = fmt.Errorf("outcome %v, want a replay", a.Outcome)
			}
			return err
		})
	})
	b.Run("FirstExecution", func(b *testing.B) {
		prefix := strconv.FormatInt(time.Now().UnixNano(), 36) + "-"
		lockstep(b, func(j, i int) error {
			key := prefix + strconv.Itoa(i)
			if _, err := stores[j].Acquire(ctx, req(key, "t")); err != nil {
				return err
			}
			return stores[j].Complete(ctx, key, "t", resp, time.Millisecond)
		})
	})
}
