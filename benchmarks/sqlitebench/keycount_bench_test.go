package sqlitebench

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/sqlitestore"
)

var ctx = context.Background()

// copySQL fills the records' table with copies of its record ?1, under the
// keys key(0) .. key(?2 - 1), in one statement.
const copySQL = `INSERT INTO idempotency_records
	(key, state, token, fingerprint, epoch, lease_until, ttl_until, expires_at, status, headers, body, body_omitted, updated_at)
WITH RECURSIVE g(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM g WHERE n + 1 < ?2)
SELECT printf('k%063d', g.n), t.state, t.token, t.fingerprint, t.epoch, t.lease_until, t.ttl_until, t.expires_at,
	t.status, t.headers, t.body, t.body_omitted, t.updated_at
FROM (SELECT * FROM idempotency_records WHERE key = ?1) AS t, g`

// key is the key of copy n: 64 bytes, as long as the middleware's.
func key(n uint64) string { return fmt.Sprintf("k%063d", n) }

// BenchmarkKeyCount measures the cost of a request's store calls as the
// number of live records in an SQLite file grows from 10^3 to 10^6, in
// lockstep: four files, each opened by a Store of its own, hold 10^3,
// 10^4, 10^5 and 10^6 COMPLETE records, and every op makes the request
// once on each, in an order that rotates from op to op, so that all sizes
// meet the same background load. Replay is Acquire of a record picked at
// random; FirstExecution is Acquire of a new key, then Complete (two
// commits, each synced to disk). Records have 64-byte keys and hold a
// 14-byte body; the table is filled in one transaction through Store.DB,
// then checkpointed. It reports the mean time of a request at each size
// (ns/req@keys=N).
func BenchmarkKeyCount(b *testing.B) {
	dir := b.TempDir()
	sizes := []int{1_000, 10_000, 100_000, 1_000_000}
	resp := &idempotency.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"pay_1"}`)}
	req := func(key, token string) idempotency.AcquireRequest {
		return idempotency.AcquireRequest{Key: key, Token: token, Fingerprint: strings.Repeat("f", 64), Lease: time.Hour, TTL: time.Hour}
	}
	stores := make([]*sqlitestore.Store, len(sizes))
	for j, n := range sizes {
		s, err := sqlitestore.Open(filepath.Join(dir, fmt.Sprintf("records_%d.db", n)))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		if _, err := s.Acquire(ctx, req("template", "t")); err != nil {
			b.Fatal(err)
		}
		if err := s.Complete(ctx, "template", "t", resp, time.Hour); err != nil {
			b.Fatal(err)
		}
		tx, err := s.DB().BeginTx(ctx, nil)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, copySQL, "template", n); err != nil {
			tx.Rollback()
			b.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
		// The fill's pages move from the WAL to the file, and the WAL
		// empties, as checkpoints keep it in a file in use.
		if _, err := s.DB().ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
			b.Fatal(err)
		}
		stores[j] = s
	}
	lockstep := func(b *testing.B, op func(j, i int) error) {
		total := make([]time.Duration, len(sizes))
		for k := range sizes { // untimed: opens the connections
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
			a, err := stores[j].Acquire(ctx, req(key(x%uint64(sizes[j])), "dup"))
			if err == nil && a.Outcome != idempotency.Completed {
				err = fmt.Errorf("outcome %v, want a replay", a.Outcome)
			}
			return err
		})
	})
	b.Run("FirstExecution", func(b *testing.B) {
		prefix := fmt.Sprintf("n%x-", time.Now().UnixNano())
		lockstep(b, func(j, i int) error {
			key := fmt.Sprintf("%s%d", prefix, i)
			if _, err := stores[j].Acquire(ctx, req(key, "t")); err != nil {
				return err
			}
			return stores[j].Complete(ctx, key, "t", resp, time.Millisecond)
		})
	})
}
