package lifecycle_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/outbox/lifecycle/lifecycletest"
	"github.com/go-idempotency/idempotency/pgstore"
)

var ctx = context.Background()

// The handles the package documents are PgxDBs and SQLDBs.
var (
	_ lifecycle.PgxDB = (*pgxpool.Pool)(nil)
	_ lifecycle.PgxDB = (*pgx.Conn)(nil)
	_ lifecycle.PgxDB = pgx.Tx(nil)
	_ lifecycle.SQLDB = (*sql.DB)(nil)
	_ lifecycle.SQLDB = (*sql.Conn)(nil)
	_ lifecycle.SQLDB = (*sql.Tx)(nil)
)

// outboxIn creates a schema of its own on the database at url, and the
// outbox table in it (a name with a schema, as pgstore.WithOutboxTable
// takes it), and returns the table and a pool whose sessions are named
// after the schema (application_name).
func outboxIn(t *testing.T, url, schema string) (*lifecycle.Table, *pgxpool.Pool) {
	t.Helper()
	pool := pgtest.PoolOn(t, url, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["application_name"] = schema })
	name := schema + ".idempotency_outbox"
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema+";\n"+pgstore.OutboxSchema(name)); err != nil {
		t.Fatal(err)
	}
	table, err := lifecycle.New(name, lifecycle.PostgreSQL)
	if err != nil {
		t.Fatal(err)
	}
	return table, pool
}

// TestConformance runs the conformance suite's edges on PostgreSQL: in one
// database, each subtest on an outbox table of its own, in a schema of its
// own, through a pool whose sessions only it names, so that LockWaits
// counts its own transactions' waits alone.
func TestConformance(t *testing.T) {
	url := pgtest.Database(t)
	var n atomic.Int64
	lifecycletest.RunEdges(t, func(t *testing.T) lifecycletest.Target {
		schema := fmt.Sprintf("edges_%d", n.Add(1))
		table, pool := outboxIn(t, url, schema)
		return lifecycletest.Target{
			DB:                lifecycle.Pgx(pool),
			Table:             table,
			ConcurrentWriters: true,
			LockWaits: func(t *testing.T) int {
				var n int
				if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE datname = current_database() AND application_name = $1 AND wait_event_type = 'Lock'`, schema).Scan(&n); err != nil {
					t.Error(err)
				}
				return n
			},
			ClockResolution: time.Microsecond,
			Corruptions:     corruptions(pool, table.Name()),
		}
	})
}

// corruptions are the rows of PostgreSQL's outbox table named name that
// the claim cannot read: an infinite time, and a NULL in a column of
// another producer's table that left it nullable.
func corruptions(pool *pgxpool.Pool, name string) []lifecycletest.Corruption {
	exec := func(t *testing.T, sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, strings.ReplaceAll(sql, "{table}", name), args...); err != nil {
			t.Fatal(err)
		}
	}
	return []lifecycletest.Corruption{
		{Name: "infinity", Want: "column enqueued_at is not a finite time: infinity", Corrupt: func(t *testing.T, key string, seq int) {
			exec(t, `UPDATE {table} SET enqueued_at = 'infinity' WHERE storage_key = $1 AND seq = $2`, key, seq)
		}},
		{Name: "NULL", Want: "column payload is NULL", Corrupt: func(t *testing.T, key string, seq int) {
			exec(t, `ALTER TABLE {table} ALTER COLUMN payload DROP NOT NULL`)
			exec(t, `UPDATE {table} SET payload = NULL WHERE storage_key = $1 AND seq = $2`, key, seq)
		}},
	}
}

// TestEnqueueNotifies: the transaction that enqueues notifies the relays
// listening on the table's channel (its name without the schema) when it
// commits.
func TestEnqueueNotifies(t *testing.T) {
	url := pgtest.Database(t)
	table, pool := outboxIn(t, url, "billing")
	listener, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(ctx)
	if _, err := listener.Exec(ctx, `LISTEN idempotency_outbox`); err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := table.Enqueue(ctx, lifecycle.Pgx(tx), "k", []lifecycle.NewMessage{{Topic: "t"}})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	nctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if n, err := listener.WaitForNotification(nctx); err != nil || n.Channel != "idempotency_outbox" {
		t.Errorf("notification %+v, %v", n, err)
	}
}

// TestEdgesOfTheDocumentation: the edges' states are those of the package
// documentation's table, and every state is reachable and left.
func TestEdgesOfTheDocumentation(t *testing.T) {
	to := map[lifecycle.State]bool{}
	from := map[lifecycle.State]bool{}
	for _, e := range lifecycle.Edges() {
		for _, s := range e.To() {
			to[s] = true
		}
		for _, s := range e.From() {
			from[s] = true
			if !s.Valid() {
				t.Errorf("%s: %q is not a state", e.Name(), s)
			}
		}
	}
	for _, s := range lifecycle.States() {
		if !to[s] || !from[s] {
			t.Errorf("%s: reached %v, left %v", s, to[s], from[s])
		}
	}
	for _, e := range []lifecycle.Edge{lifecycle.EdgeExtend, lifecycle.EdgeRelease, lifecycle.EdgeDone, lifecycle.EdgeRetry,
		lifecycle.EdgeRefuse, lifecycle.EdgeUnreadable, lifecycle.EdgeSinkSuspend, lifecycle.EdgeReclaim} {
		if !slices.Equal(e.From(), []lifecycle.State{lifecycle.Claimed}) {
			t.Errorf("%s moves from %v, want claimed only", e.Name(), e.From())
		}
	}
	for _, s := range lifecycle.Terminal() {
		for _, e := range lifecycle.Edges() {
			if e.Allows(s) && e.Name() != "requeue" && e.Name() != "purge" {
				t.Errorf("%s moves a finished message (%s)", e.Name(), s)
			}
		}
	}
}
