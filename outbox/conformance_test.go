package outbox_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/outbox/lifecycle/lifecycletest"
	"github.com/go-idempotency/idempotency/pgstore"
)

// TestConformance runs the conformance suite's part of Enqueue and Cancel
// on PostgreSQL: in one database, each subtest on a Store of its own whose
// tables are in a schema of its own (names with a schema, as pgstore's
// options take them), through a pool whose sessions only it names, so
// that LockWaits counts its own transactions' waits alone.
func TestConformance(t *testing.T) {
	url := pgtest.Database(t)
	var n atomic.Int64
	lifecycletest.RunOutbox(t, func(t *testing.T) lifecycletest.Target {
		schema := fmt.Sprintf("calls_%d", n.Add(1))
		pool := pgtest.PoolOn(t, url, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["application_name"] = schema })
		if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema+";\n"+refusingTables(schema)); err != nil {
			t.Fatal(err)
		}
		opts := []pgstore.Option{pgstore.WithTable(schema + ".records"), pgstore.WithOutboxTable(schema + ".outbox")}
		if err := pgstore.Migrate(ctx, pool, opts...); err != nil {
			t.Fatal(err)
		}
		store := pgstore.New(pool, opts...)
		t.Cleanup(func() { store.Close() })
		table, err := outbox.Table(store.OutboxTable())
		if err != nil {
			t.Fatal(err)
		}
		return lifecycletest.Target{
			DB:                lifecycle.Pgx(pool),
			Table:             table,
			Store:             store,
			ConcurrentWriters: true,
			LockWaits: func(t *testing.T) int {
				n := lockWaits(pool, schema)
				if n < 0 {
					t.Error("lock waits: the query failed")
				}
				return max(n, 0)
			},
			ClockResolution: time.Microsecond,
			FailCommit: func(ctx context.Context) error {
				tx, _ := pgstore.TxFromContext(ctx)
				_, err := tx.Exec(ctx, `INSERT INTO `+schema+`.refused VALUES (42)`)
				return err
			},
		}
	})
}

// refusingTables is the SQL that creates, in schema, the table refused,
// whose rows break a deferred constraint: the COMMIT of a transaction that
// inserted one fails.
func refusingTables(schema string) string {
	return fmt.Sprintf(`CREATE TABLE %[1]s.accounts (id int PRIMARY KEY);
CREATE TABLE %[1]s.refused (account int REFERENCES %[1]s.accounts DEFERRABLE INITIALLY DEFERRED);`, schema)
}

// lockWaits returns how many sessions of pool's database named app (any,
// when app is "") wait for a lock, or -1 when the query fails.
func lockWaits(pool *pgxpool.Pool, app string) int {
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND ($1 = '' OR application_name = $1) AND wait_event_type = 'Lock'`, app).Scan(&n); err != nil {
		return -1
	}
	return n
}
