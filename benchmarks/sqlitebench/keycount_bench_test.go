package sqlitebench

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/benchmarks/internal/keycount"
	"github.com/go-idempotency/idempotency/benchmarks/internal/sqlitefloor"
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
// (ns/req@keys=N) and, for Replay, that of the record floor on the same
// file (ns/floor@keys=N: internal/sqlitefloor's SELECT by primary key,
// through the Store's own *sql.DB, of another record picked at random),
// which tells the file's own rise from the store's.
func BenchmarkKeyCount(b *testing.B) {
	dir := b.TempDir()
	stores := make([]idempotency.Store, len(keycount.Sizes))
	floors := make([]*sqlitefloor.Floor, len(keycount.Sizes))
	for j, n := range keycount.Sizes {
		s, err := sqlitestore.Open(filepath.Join(dir, fmt.Sprintf("records_%d.db", n)))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		if err := keycount.Template(ctx, s); err != nil {
			b.Fatal(err)
		}
		tx, err := s.DB().BeginTx(ctx, nil)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, copySQL, keycount.TemplateKey, n); err != nil {
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
		if floors[j], err = sqlitefloor.New(ctx, s.DB(), floorRecord); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(floors[j].Close)
	}
	keycount.Run(b, stores, key, func(ctx context.Context, j int, key string) error {
		_, err := floors[j].Read(ctx, key)
		return err
	})
}
