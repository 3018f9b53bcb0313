package pgstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/pgstore"
)

// TestMigrateBesideWriters: on a schema already in place, Migrate finishes
// while a transaction that writes every table of the schema is still open.
// A CREATE INDEX IF NOT EXISTS waits for such a transaction even when the
// index exists, and writers that come after wait behind it; run by an
// instance starting beside serving ones, it stalled their writes and
// deadlocked with a transaction that wrote the outbox and then the records
// (seen as "deadlock detected" from a consumer starting mid-traffic).
func TestMigrateBesideWriters(t *testing.T) {
	pool, opt := migratedIn(t, "Idem")
	writer, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Rollback(ctx)
	// ROW EXCLUSIVE is the lock every INSERT, UPDATE and DELETE takes.
	for _, table := range []string{`billing.idempotency_outbox`, `billing."Idem"`, `billing.idempotency_state`, `billing.idempotency_state_history`} {
		if _, err := writer.Exec(ctx, `LOCK TABLE `+table+` IN ROW EXCLUSIVE MODE`); err != nil {
			t.Fatal(err)
		}
	}
	// The bound is a failure's, never waited out when Migrate is right.
	bound, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pgstore.Migrate(bound, pool, opt); err != nil {
		t.Fatalf("Migrate beside an open writer: %v", err)
	}
	if _, err := writer.Exec(ctx, `LOCK TABLE billing."Idem" IN ROW EXCLUSIVE MODE`); err != nil {
		t.Fatalf("the writer after Migrate: %v", err)
	}
	if err := writer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestMigrateRepairs: Migrate creates again whatever of the schema is
// missing (an index of the records, one of the outbox, the state records'
// history table) and puts back the acquire function when it was changed,
// leaving what is in place as it was.
func TestMigrateRepairs(t *testing.T) {
	pool := pgtest.Pool(t)
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	function := func() string {
		var src string
		if err := pool.QueryRow(ctx, `SELECT prosrc FROM pg_proc WHERE proname = 'idempotency_records_acquire'`).Scan(&src); err != nil {
			t.Fatal(err)
		}
		return src
	}
	installed := function()
	if _, err := pool.Exec(ctx, `INSERT INTO idempotency_state VALUES ('acme', 'm', 'kept', 's', 1, '{}', now(), now())`); err != nil {
		t.Fatal(err)
	}
	for _, drop := range []string{
		`DROP INDEX idempotency_records_expires_at_idx`,
		`DROP INDEX idempotency_outbox_claim_idx`,
		`DROP TABLE idempotency_state_history`,
		`CREATE OR REPLACE FUNCTION idempotency_records_acquire(
			p_key text, p_token text, p_fingerprint bytea, p_lease interval, p_ttl interval, n timestamptz)
			RETURNS bigint[] LANGUAGE sql AS 'SELECT ARRAY[0, 0, 0]::bigint[]'`,
	} {
		if _, err := pool.Exec(ctx, drop); err != nil {
			t.Fatalf("%s: %v", drop, err)
		}
	}
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{`idempotency_records_expires_at_idx`, `idempotency_outbox_claim_idx`, `idempotency_state_history`} {
		var present bool
		if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, rel).Scan(&present); err != nil || !present {
			t.Errorf("%s after Migrate: present %v, %v", rel, present, err)
		}
	}
	if got := function(); got != installed {
		t.Errorf("the acquire function after Migrate:\n%s\nwant:\n%s", got, installed)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_state WHERE id = 'kept'`).Scan(&n); err != nil || n != 1 {
		t.Errorf("the state row after Migrate: %d, %v", n, err)
	}
}

// TestAcquireFunctionLast: the statement Migrate runs on a schema in place
// is the whole of RecordsSchema's function, its last statement, and
// creates nothing else.
func TestAcquireFunctionLast(t *testing.T) {
	for name, function := range map[string]string{
		pgstore.DefaultTable: `"idempotency_records_acquire"`,
		"billing.Idem":       `"billing"."Idem_acquire"`,
	} {
		all, fn := pgstore.RecordsSchema(name), pgstore.AcquireFunction(name)
		if !strings.HasSuffix(all, fn) || !strings.HasPrefix(fn, "CREATE OR REPLACE FUNCTION "+function+"(") || strings.Count(fn, "CREATE ") != 1 {
			t.Errorf("AcquireFunction(%s):\n%s", name, fn)
		}
	}
}
