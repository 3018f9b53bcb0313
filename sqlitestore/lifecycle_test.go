package sqlitestore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/outbox/lifecycle/lifecycletest"
	"github.com/go-idempotency/idempotency/sqlitestore"
)

// TestLifecycleConformance runs the outbox's conformance suite on SQLite:
// each subtest on a file of its own, the Store's outbox through OutboxDB,
// and outbox.Enqueue and outbox.Cancel in the transactions of a Runner
// over the Store. SQLite runs one write transaction at a time (no
// ConcurrentWriters), and its clock has a resolution of a millisecond.
func TestLifecycleConformance(t *testing.T) {
	lifecycletest.Run(t, func(t *testing.T) lifecycletest.Target {
		s := open(t, newPath(t))
		if _, err := s.DB().ExecContext(ctx, `CREATE TABLE accounts (id INTEGER PRIMARY KEY);
CREATE TABLE refused (account INTEGER REFERENCES accounts DEFERRABLE INITIALLY DEFERRED);`); err != nil {
			t.Fatal(err)
		}
		table, err := lifecycle.New(sqlitestore.DefaultOutboxTable, lifecycle.SQLite)
		if err != nil {
			t.Fatal(err)
		}
		db := s.OutboxDB()
		exec := func(t *testing.T, sql string, args ...any) {
			t.Helper()
			if err := db.Exec(ctx, strings.ReplaceAll(sql, "{table}", sqlitestore.DefaultOutboxTable), args...); err != nil {
				t.Fatal(err)
			}
		}
		return lifecycletest.Target{
			DB:              db,
			Table:           table,
			Store:           s,
			ClockResolution: time.Millisecond,
			// A column's type is its values' in SQLite: a row written by
			// another producer may hold a text where a time is, or a
			// number where the payload is.
			Corruptions: []lifecycletest.Corruption{
				{Name: "text time", Want: "column enqueued_at is a string, not time (INTEGER unix microseconds)", Corrupt: func(t *testing.T, key string, seq int) {
					exec(t, `UPDATE {table} SET enqueued_at = 'soon' WHERE storage_key = ?1 AND seq = ?2`, key, seq)
				}},
				{Name: "number payload", Want: "column payload is a int64, not bytes", Corrupt: func(t *testing.T, key string, seq int) {
					exec(t, `UPDATE {table} SET payload = 42 WHERE storage_key = ?1 AND seq = ?2`, key, seq)
				}},
			},
			FailCommit: func(ctx context.Context) error {
				tx, _ := sqlitestore.TxFromContext(ctx)
				_, err := tx.ExecContext(ctx, `INSERT INTO refused VALUES (42)`)
				return err
			},
		}
	})
}
