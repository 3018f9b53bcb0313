package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/pgstore"
)

// pgFixture is a database of its own with pgstore's table and a Store.
type pgFixture struct {
	url   string
	pool  *pgxpool.Pool
	store *pgstore.Store
}

func newPGFixture(t *testing.T) *pgFixture {
	t.Helper()
	url := pgtest.Database(t)
	pool := pgtest.PoolOn(t, url)
	if err := pgstore.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	s := pgstore.New(pool)
	t.Cleanup(func() { s.Close() })
	return &pgFixture{url: url, pool: pool, store: s}
}

func (f *pgFixture) run(t *testing.T, cmd string, args ...string) result {
	t.Helper()
	return idemctl(t, nil, append([]string{cmd, "-postgres", f.url}, args...)...)
}

func (f *pgFixture) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := f.pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// waitFor waits until cond, an SQL condition on the row of storage key
// sk, holds on the server's clock.
func (f *pgFixture) waitFor(t *testing.T, sk, cond string) {
	t.Helper()
	if !redistest.WaitFor(5*time.Second, func() bool {
		var ok bool
		err := f.pool.QueryRow(context.Background(), "SELECT "+cond+" FROM idempotency_records WHERE key = $1", sk).Scan(&ok)
		return err == nil && ok
	}) {
		t.Fatalf("%s never held for %s", cond, sk)
	}
}

// The conditions waitFor waits for.
const (
	leaseRanOut = "lease_until <= clock_timestamp()"
	rowExpired  = "expires_at <= clock_timestamp()"
)

func (f *pgFixture) rows(t *testing.T) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), "SELECT count(*) FROM idempotency_records").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestPostgresInspect(t *testing.T) {
	f := newPGFixture(t)
	sk := complete(t, f.store, "user-42", "charge-1", jsonResponse(kib), time.Hour)

	r := f.run(t, "inspect", "-scope", "user-42", "-key", "charge-1").want(t, exitOK)
	r.contains(t, "storage key  "+sk, "location     idempotency_records row "+sk, "state        complete",
		"status       201 Created", "  Content-Type: application/json", "body         1024 bytes, first 512 shown",
		`  | {"id":"ch_1"`, "updated      ")
	if !strings.Contains(r.stdout, "expires in   59m") && !strings.Contains(r.stdout, "expires in   1h0m\n") {
		t.Errorf("no TTL left shown:\n%s", r.stdout)
	}

	var j recordJSON
	f.run(t, "inspect", sk, "-json", "-body", "0").want(t, exitOK).decode(t, &j)
	if j.State != stateComplete || j.Status != 201 || j.BodyBytes != 1024 || j.BodyPreviewBase64 != "" ||
		j.Headers.Get("Location") != "/charges/ch_1" || j.Fingerprint != fmt.Sprintf("%x", "fp-charge-1") {
		t.Errorf("inspect -json: %+v", j)
	}

	hold(t, f.store, "", "running", 30*time.Second, time.Hour)
	f.run(t, "inspect", "-key", "running").want(t, exitOK).contains(t, "state        in_progress", "lease        live, 29.")

	// A row past its expiry that the purge has not deleted.
	sk2, tok := hold(t, f.store, "", "expired", 20*time.Millisecond, 20*time.Millisecond)
	if err := f.store.Complete(context.Background(), sk2, tok, jsonResponse([]byte("{}")), 20*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	f.waitFor(t, sk2, rowExpired)
	f.run(t, "inspect", sk2).want(t, exitOK).contains(t, "state        expired", "absent to requests")

	// A headers block that does not decode.
	bad := complete(t, f.store, "", "bad", jsonResponse([]byte("{}")), time.Hour)
	f.exec(t, "UPDATE idempotency_records SET headers = '\\x09'::bytea WHERE key = $1", bad)
	f.run(t, "inspect", bad).want(t, exitOK).contains(t, "state        corrupt: ", "unknown meta version 9")

	f.run(t, "inspect", "-key", "never-was").want(t, exitNotFound).contains(t, "no record at idempotency_records row")
	idemctl(t, map[string]string{"DATABASE_URL": f.url}, "inspect", sk).want(t, exitOK).contains(t, "state        complete")
}

func TestPostgresDeleteAndRelease(t *testing.T) {
	f := newPGFixture(t)
	ctx := context.Background()
	exists := func(sk string) bool {
		var ok bool
		if err := f.pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM idempotency_records WHERE key = $1)", sk).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}

	done := complete(t, f.store, "", "done", jsonResponse([]byte("{}")), time.Hour)
	f.run(t, "release", "-force", done).want(t, exitRefused).contains(t, "this one is complete")
	f.run(t, "delete", done).want(t, exitRefused).contains(t, "COMPLETE")
	f.run(t, "delete", "-force", done).want(t, exitOK).contains(t, "deleted idempotency_records row "+done+" (complete, epoch 1)")
	if exists(done) {
		t.Error("delete -force left the row")
	}

	live, _ := hold(t, f.store, "", "live", time.Minute, time.Hour)
	f.run(t, "release", live).want(t, exitRefused).contains(t, "lease is live")
	f.run(t, "release", "-force", "-epoch", "3", live).want(t, exitRefused).contains(t, "epoch 1, not 3")

	// A waiter on the record is notified of the release.
	listener, err := pgx.Connect(ctx, f.url)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(ctx)
	if _, err := listener.Exec(ctx, `LISTEN idempotency_records`); err != nil {
		t.Fatal(err)
	}
	if a, err := f.store.Acquire(ctx, idempotency.AcquireRequest{Key: live, Token: newToken(), Fingerprint: "fp-live", Lease: time.Minute, TTL: time.Hour}); err != nil || a.Outcome != idempotency.InFlight {
		t.Fatalf("duplicate: %+v, %v", a, err)
	}
	f.run(t, "release", "-force", live).want(t, exitOK).contains(t, "released", "lease live")
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	n, err := listener.WaitForNotification(wctx)
	if err != nil || n.Payload != live {
		t.Errorf("notification after release: %+v, %v; want payload %s", n, err, live)
	}
	if exists(live) {
		t.Error("release -force left the row")
	}

	ranOut, _ := hold(t, f.store, "", "ran-out", 10*time.Millisecond, time.Hour)
	f.waitFor(t, ranOut, leaseRanOut)
	f.run(t, "release", ranOut).want(t, exitOK).contains(t, "lease ran out")

	// An expired row is absent to release, and delete removes it.
	gone, _ := hold(t, f.store, "", "gone", 10*time.Millisecond, 10*time.Millisecond)
	f.waitFor(t, gone, rowExpired)
	f.run(t, "release", gone).want(t, exitNotFound)
	f.run(t, "delete", gone).want(t, exitOK).contains(t, "(expired")
	f.run(t, "delete", gone).want(t, exitNotFound)

	// A row locked by a transaction in progress is not waited for.
	locked, _ := hold(t, f.store, "", "locked", 10*time.Millisecond, time.Hour)
	f.waitFor(t, locked, leaseRanOut)
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT FROM idempotency_records WHERE key = $1 FOR UPDATE", locked); err != nil {
		t.Fatal(err)
	}
	f.run(t, "release", locked).want(t, exitFailure).contains(t, "locked by a transaction in progress")
	tx.Rollback(ctx)
	f.run(t, "release", locked).want(t, exitOK)
}

func TestPostgresList(t *testing.T) {
	f := newPGFixture(t)
	var completes, running []string
	for i := range 3 {
		completes = append(completes, complete(t, f.store, "", fmt.Sprint("done-", i), jsonResponse(kib), time.Hour))
	}
	for i := range 2 {
		sk, _ := hold(t, f.store, "", fmt.Sprint("run-", i), time.Minute, time.Hour)
		running = append(running, sk)
	}
	old, _ := hold(t, f.store, "", "old", time.Minute, time.Hour)
	// Acquired 40 minutes ago, by its TTL deadline.
	f.exec(t, "UPDATE idempotency_records SET ttl_until = ttl_until - interval '40 minutes' WHERE key = $1", old)
	running = append(running, old)

	rows := f.run(t, "list", "-batch", "2").want(t, exitOK).contains(t, "idemctl list: 6 records").rows()
	if len(rows) != 6 {
		t.Fatalf("list -batch 2: %d rows, want 6:\n%s", len(rows), strings.Join(rows, "\n"))
	}
	if got := keysOf(f.run(t, "list", "-state", "in_progress", "-ttl", "1h").want(t, exitOK).rows()); !sameSet(got, running) {
		t.Errorf("list -state in_progress: %v, want %v", got, running)
	}
	r := f.run(t, "list", "-state", "in_progress", "-ttl", "1h", "-older", "30m").want(t, exitOK)
	if got := keysOf(r.rows()); len(got) != 1 || got[0] != old {
		t.Errorf("list -older 30m: %v, want %s", got, old)
	}
	lines := f.run(t, "list", "-state", "complete", "-json").want(t, exitOK).jsonLines(t)
	var got []string
	for _, j := range lines {
		got = append(got, j.StorageKey)
		if j.Status != 201 || j.BodyBytes != 1024 {
			t.Errorf("line %+v", j)
		}
	}
	if !sameSet(got, completes) {
		t.Errorf("list -state complete: %v, want %v", got, completes)
	}

	gone, _ := hold(t, f.store, "", "gone", 10*time.Millisecond, 10*time.Millisecond)
	f.waitFor(t, gone, rowExpired)
	if got := keysOf(f.run(t, "list", "-state", "expired").want(t, exitOK).rows()); len(got) != 1 || got[0] != gone {
		t.Errorf("list -state expired: %v, want %s", got, gone)
	}

	defer func(d time.Duration) { progressEvery = d }(progressEvery)
	progressEvery = 0
	f.run(t, "list", "-batch", "3", "-limit", "4").want(t, exitOK).contains(t, "idemctl: scanned 3 rows", "stopped at -limit 4")
}

func TestPostgresStats(t *testing.T) {
	f := newPGFixture(t)
	for i := range 50 {
		complete(t, f.store, "", fmt.Sprint("c-", i), jsonResponse(kib), time.Hour)
	}
	hold(t, f.store, "", "live", time.Minute, time.Hour)
	gone, _ := hold(t, f.store, "", "gone", 10*time.Millisecond, 10*time.Millisecond)
	f.waitFor(t, gone, rowExpired)

	var res statsResult
	f.run(t, "stats", "-json").want(t, exitOK).decode(t, &res)
	cats := map[string]*category{}
	for _, c := range res.Categories {
		cats[c.State] = c
	}
	if c := cats[stateComplete]; c == nil || c.Records != 50 || c.BodyBytes != 50*1024 || c.BytesPerRecord < 1024 || c.BytesPerRecord > 2048 {
		t.Errorf("complete: %+v", c)
	} else {
		t.Logf("pg_column_size of a COMPLETE row with a 1 KiB body: %d bytes", c.BytesPerRecord)
	}
	if c := cats[catLive]; c == nil || c.Records != 1 {
		t.Errorf("in progress, live: %+v", c)
	}
	if c := cats[stateExpired]; c == nil || c.Records != 1 {
		t.Errorf("expired: %+v", c)
	}
	if res.Table == nil || res.Table.Total <= 0 || res.Table.Index <= 0 || res.Table.Total < res.Table.Heap+res.Table.Index {
		t.Errorf("table size %+v", res.Table)
	}
	f.run(t, "stats").want(t, exitOK).contains(t, "table idempotency_records: ", "on disk per record: ", "complete")
}

func TestPostgresCheck(t *testing.T) {
	f := newPGFixture(t)
	r := f.run(t, "check").want(t, exitOK)
	r.lines(t, [][]string{{"OK", "version"}, {"OK", "recovery", "primary"}, {"OK", "table", "idempotency_records"},
		{"OK", "columns", "14 columns"}, {"OK", "primary-key", "(key)"}, {"OK", "expires-at-index", "idempotency_records_expires_at_idx"},
		{"OK", "acquire-function", `"idempotency_records_acquire"`},
		{"OK", "fsync"}, {"OK", "purge", "no row past its expiry"}, {"INFO", "clock"}})
	if strings.Contains(r.stdout, "\nFAIL") {
		t.Errorf("FAIL on a fresh table:\n%s", r.stdout)
	}
	var out struct {
		Verdict  string `json:"verdict"`
		Findings []struct {
			Item, Verdict string
		} `json:"findings"`
	}
	f.run(t, "check", "-json").want(t, exitOK).decode(t, &out)
	if len(out.Findings) < 10 {
		t.Errorf("check -json: %d findings", len(out.Findings))
	}

	// The role's settings are what this connection sees: a timeout set on
	// the database clears that warning.
	f.exec(t, fmt.Sprintf(`ALTER DATABASE %s SET idle_in_transaction_session_timeout = '60s'`, pgx.Identifier{dbName(t, f)}.Sanitize()))
	f.run(t, "check").want(t, exitOK).lines(t, [][]string{{"OK", "idle_in_transaction_session_timeout", "1min"}})
	f.exec(t, fmt.Sprintf(`ALTER DATABASE %s SET synchronous_commit = off`, pgx.Identifier{dbName(t, f)}.Sanitize()))
	f.run(t, "check").want(t, exitOK).lines(t, [][]string{{"WARN", "synchronous_commit", "off"}})
	f.run(t, "check", "-strict").want(t, exitFailure)

	// An old expired row: the purge is not running.
	sk, _ := hold(t, f.store, "", "stale", 10*time.Millisecond, 10*time.Millisecond)
	f.exec(t, "UPDATE idempotency_records SET ttl_until = ttl_until - interval '3 hours', lease_until = lease_until - interval '3 hours' WHERE key = $1", sk)
	f.run(t, "check").want(t, exitOK).lines(t, [][]string{{"WARN", "purge", "a row expired 3h0m"}})
	f.run(t, "check", "-purge-lag", "4h").want(t, exitOK).lines(t, [][]string{{"OK", "purge"}})
	f.run(t, "check", "-purge-lag", "-1s").want(t, exitUsage).contains(t, "-purge-lag -1s is negative")

	// No index on expires_at.
	f.exec(t, `DROP INDEX idempotency_records_expires_at_idx`)
	f.run(t, "check").want(t, exitOK).lines(t, [][]string{{"WARN", "expires-at-index", "missing"}})

	// No acquire function: every new key would fail.
	f.exec(t, `DROP FUNCTION idempotency_records_acquire`)
	f.run(t, "check").want(t, exitFailure).lines(t, [][]string{{"FAIL", "acquire-function", `"idempotency_records_acquire" missing`}})

	// A table that is not there, and one that is not pgstore's.
	f.run(t, "check", "-table", "nope").want(t, exitFailure).lines(t, [][]string{{"FAIL", "table", "nope missing"}}).contains(t, "UNSAFE")
	f.exec(t, `CREATE TABLE other (id bigint PRIMARY KEY, state text)`)
	f.run(t, "check", "-table", "other").want(t, exitFailure).
		lines(t, [][]string{{"FAIL", "columns", "key missing"}, {"FAIL", "primary-key", "(id)"}})
}

// dbName returns the name of f's database.
func dbName(t *testing.T, f *pgFixture) string {
	var name string
	if err := f.pool.QueryRow(context.Background(), "SELECT current_database()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	return name
}

func TestPostgresSchemaTable(t *testing.T) {
	url := pgtest.Database(t)
	pool := pgtest.PoolOn(t, url)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE SCHEMA billing`); err != nil {
		t.Fatal(err)
	}
	if err := pgstore.Migrate(ctx, pool, pgstore.WithTable("billing.idem")); err != nil {
		t.Fatal(err)
	}
	s := pgstore.New(pool, pgstore.WithTable("billing.idem"))
	defer s.Close()
	sk := complete(t, s, "", "k", jsonResponse([]byte("{}")), time.Hour)
	idemctl(t, nil, "inspect", "-postgres", url, "-table", "billing.idem", sk).want(t, exitOK).contains(t, "billing.idem row "+sk)
	idemctl(t, nil, "check", "-postgres", url, "-table", "billing.idem").want(t, exitOK).lines(t, [][]string{{"OK", "expires-at-index", "idem_expires_at_idx"},
		{"OK", "acquire-function", `"billing"."idem_acquire"`}})
	idemctl(t, nil, "inspect", "-postgres", url, sk).want(t, exitFailure).contains(t, "does not exist")
}
