package pgstore_test

import (
	"strings"
	"testing"

	"github.com/go-idempotency/idempotency/pgstore"
)

// TestStateSchema: the state records' SQL for another name names the
// table and its history, quoted, everywhere the default names stood;
// Schema carries it, in the records' schema; a name whose history would be
// longer than PostgreSQL's identifiers is refused, not cut.
func TestStateSchema(t *testing.T) {
	got := pgstore.StateSchema("billing.Flows")
	for _, want := range []string{
		`CREATE TABLE IF NOT EXISTS "billing"."Flows" (`,
		`CREATE TABLE IF NOT EXISTS "billing"."Flows_history" (`,
		`PRIMARY KEY (scope, machine, id)`,
		`PRIMARY KEY (key, version)`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("StateSchema(billing.Flows) lacks %s", want)
		}
	}
	if strings.Contains(got, `"idempotency_state`) {
		t.Errorf("StateSchema(billing.Flows) still names a default table:\n%s", got)
	}
	if h := pgstore.StateHistoryTable("billing.Flows"); h != "billing.Flows_history" {
		t.Errorf("StateHistoryTable = %q", h)
	}
	all := pgstore.Schema("billing.idem")
	for _, want := range []string{
		`CREATE TABLE IF NOT EXISTS "billing"."idempotency_state" (`,
		`CREATE TABLE IF NOT EXISTS "billing"."idempotency_state_history" (`,
	} {
		if !strings.Contains(all, want) {
			t.Errorf("Schema(billing.idem) lacks %s", want)
		}
	}
	wantPanic(t, "StateSchema of a 60-byte name", func() { pgstore.StateSchema(strings.Repeat("s", 60)) })
	wantPanic(t, "StateSchema of a bad name", func() { pgstore.StateSchema("a b") })
}

// TestMigrateState: Migrate creates the state records' tables beside the
// records' table, in its schema, and running it again changes nothing:
// a row written between the two runs is still there. The tables refuse a
// version below 1 (below 2 in the history), and data that is not JSON.
func TestMigrateState(t *testing.T) {
	pool, opt := migratedIn(t, "idem")
	if _, err := pool.Exec(ctx, `INSERT INTO billing.idempotency_state VALUES ('acme', 'payments.payment', 'pay_1', 'authorized', 1, '{"amount": 1999}', now(), now())`); err != nil {
		t.Fatal(err)
	}
	if err := pgstore.Migrate(ctx, pool, opt); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	var data string
	if err := pool.QueryRow(ctx, `SELECT data::text FROM billing.idempotency_state WHERE id = 'pay_1'`).Scan(&data); err != nil || data != `{"amount": 1999}` {
		t.Fatalf("the row after a second Migrate: %q, %v (json keeps the text as given)", data, err)
	}
	for _, bad := range []string{
		`INSERT INTO billing.idempotency_state VALUES ('acme', 'm', 'v0', 's', 0, '{}', now(), now())`,
		`INSERT INTO billing.idempotency_state VALUES ('acme', 'm', 'notjson', 's', 1, 'nope', now(), now())`,
		`INSERT INTO billing.idempotency_state_history VALUES ('k', 1, 'a', 'b', '{}', now())`,
	} {
		if _, err := pool.Exec(ctx, bad); err == nil {
			t.Errorf("accepted: %s", bad)
		}
	}
	var elsewhere bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('public.idempotency_state') IS NOT NULL`).Scan(&elsewhere); err != nil || elsewhere {
		t.Fatalf("a state table outside the records' schema (%v, %v)", elsewhere, err)
	}
}
