package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/pgstore"
)

func wantPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Errorf("%s did not panic", what)
		}
	}()
	f()
}

// TestOptionsPanic: misconfiguration panics at construction, never at the
// first request. None of these cases needs a server.
func TestOptionsPanic(t *testing.T) {
	for _, name := range []string{"", "1abc", "a-b", "a b", `a"b`, "a.b.c", ".a", "a.", "tbl;drop", "é", strings.Repeat("a", 64)} {
		wantPanic(t, fmt.Sprintf("WithTable(%q)", name), func() { pgstore.WithTable(name) })
		wantPanic(t, fmt.Sprintf("Schema(%q)", name), func() { pgstore.Schema(name) })
	}
	for _, name := range []string{"", strings.Repeat("c", 64), "a\x00b"} {
		wantPanic(t, fmt.Sprintf("WithChannel(%q)", name), func() { pgstore.WithChannel(name) })
	}
	wantPanic(t, "WithListenerHealthCheck(0)", func() { pgstore.WithListenerHealthCheck(0) })
	wantPanic(t, "WithPurgeInterval(-1s)", func() { pgstore.WithPurgeInterval(-time.Second) })
	wantPanic(t, "WithPurgeBatch(0)", func() { pgstore.WithPurgeBatch(0) })
	wantPanic(t, "WithPurgeErrorHandler(nil)", func() { pgstore.WithPurgeErrorHandler(nil) })
	wantPanic(t, "WithListenerConfig(nil)", func() { pgstore.WithListenerConfig(nil) })
	wantPanic(t, "New(nil)", func() { pgstore.New(nil) })
	wantPanic(t, "Migrate(nil)", func() { pgstore.Migrate(context.Background(), nil) })

	// A pool that never connects: New itself makes no connection.
	cfg, err := pgxpool.ParseConfig("postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	long := strings.Repeat("s", 40) + "." + strings.Repeat("t", 40)
	wantPanic(t, "New with a table name too long for the default channel", func() { pgstore.New(pool, pgstore.WithTable(long)) })
	wantPanic(t, "New with a nil Option", func() { pgstore.New(pool, nil) })
	s := pgstore.New(pool, pgstore.WithTable(long), pgstore.WithChannel("idem"))
	if s.Table() != `"`+strings.Repeat("s", 40)+`"."`+strings.Repeat("t", 40)+`"` || s.Channel() != "idem" {
		t.Errorf("Table %s, Channel %s", s.Table(), s.Channel())
	}
	s.Close()
}

// TestSchema: the SQL for another table names it, quoted, everywhere the
// default name stood, and names its index and acquire function after it.
func TestSchema(t *testing.T) {
	def := pgstore.Schema(pgstore.DefaultTable)
	if !strings.Contains(def, `CREATE TABLE IF NOT EXISTS "idempotency_records" (`) ||
		!strings.Contains(def, `CREATE INDEX IF NOT EXISTS "idempotency_records_expires_at_idx"`) {
		t.Fatalf("default schema:\n%s", def)
	}
	got := pgstore.Schema("billing.Idem")
	for _, want := range []string{
		`CREATE TABLE IF NOT EXISTS "billing"."Idem" (`,
		`CREATE INDEX IF NOT EXISTS "Idem_expires_at_idx"`,
		`ON "billing"."Idem" (expires_at);`,
		`CREATE OR REPLACE FUNCTION "billing"."Idem_acquire"(`,
		`INSERT INTO "billing"."Idem" AS r`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("Schema(billing.Idem) lacks %s", want)
		}
	}
	if strings.Contains(got, `"idempotency_records`) {
		t.Errorf("Schema(billing.Idem) still names the default table:\n%s", got)
	}
	// An index or function name is cut to 63 bytes, as PostgreSQL would
	// cut it.
	long := pgstore.Schema(strings.Repeat("x", 60))
	if !strings.Contains(long, `"`+strings.Repeat("x", 60)+`_ex"`) {
		t.Errorf("long table name: index not cut to 63 bytes:\n%s", long)
	}
	if !strings.Contains(long, `FUNCTION "`+strings.Repeat("x", 60)+`_ac"(`) {
		t.Errorf("long table name: function not cut to 63 bytes:\n%s", long)
	}
}

// TestMigrate: Migrate is idempotent and safe to run from many instances
// at once, on a schema-qualified, mixed-case table; the store then works on
// that table and nothing else.
func TestMigrate(t *testing.T) {
	pool := pgtest.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 8 })
	if _, err := pool.Exec(ctx, `CREATE SCHEMA billing`); err != nil {
		t.Fatal(err)
	}
	opt := pgstore.WithTable("billing.Idem")
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- pgstore.Migrate(ctx, pool, opt)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent Migrate: %v", err)
		}
	}
	if err := pgstore.Migrate(ctx, pool, opt); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	s := newStore(t, pool, opt)
	key := randKey()
	mustAcquire(t, s, req(key, "t"), idempotency.Acquired)
	if err := s.Complete(ctx, key, "t", sampleResponse(), time.Hour); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM billing."Idem" WHERE key = $1 AND state = 'complete'`, key).Scan(&n); err != nil || n != 1 {
		t.Fatalf("rows in billing.\"Idem\": %d, %v", n, err)
	}
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('public.idempotency_records') IS NOT NULL`).Scan(&exists); err != nil || exists {
		t.Fatalf("the default table exists (%v, %v)", exists, err)
	}
}

// TestMigrateLongName: with a table name of 63 bytes, the names of its
// index and acquire function are cut as PostgreSQL cuts them, and the
// store finds its function: a first acquire, a completion and a replay
// work.
func TestMigrateLongName(t *testing.T) {
	pool := pgtest.Pool(t)
	opts := []pgstore.Option{pgstore.WithTable(strings.Repeat("x", 63)), pgstore.WithChannel("idem")}
	if err := pgstore.Migrate(ctx, pool, opts...); err != nil {
		t.Fatal(err)
	}
	s := newStore(t, pool, opts...)
	key := randKey()
	mustAcquire(t, s, req(key, "t"), idempotency.Acquired)
	if err := s.Complete(ctx, key, "t", sampleResponse(), time.Hour); err != nil {
		t.Fatal(err)
	}
	a := mustAcquire(t, s, req(key, "dup"), idempotency.Completed)
	if a.Response.Status != 201 {
		t.Fatalf("replayed %+v", a.Response)
	}
}

// TestServerClock: the store sends durations, never a time of the
// application's clock, and the server writes the deadlines from its own.
func TestServerClock(t *testing.T) {
	c := &counter{}
	pool := countedPool(t, c)
	s := newStore(t, pool)
	key := randKey()
	r := req(key, "t")
	r.Lease, r.TTL = 1500*time.Millisecond, 2*time.Hour
	mustAcquire(t, s, r, idempotency.Acquired)
	if err := s.Extend(ctx, key, "t", 3*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, key, "t", sampleResponse(), time.Hour); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	for i, args := range c.args {
		for _, a := range args {
			if _, ok := a.(time.Time); ok {
				t.Errorf("statement %s sent a time.Time argument: %v", c.queries[i], a)
			}
		}
	}
	c.mu.Unlock()
	var lease, ttl time.Duration
	var skew time.Duration
	if err := pool.QueryRow(ctx, `SELECT lease_until - updated_at, ttl_until - updated_at, clock_timestamp() - updated_at
		FROM idempotency_records WHERE key = $1`, key).Scan(&lease, &ttl, &skew); err != nil {
		t.Fatal(err)
	}
	// The lease is the extend's, the TTL counts from the completion.
	if ttl != time.Hour || lease > 3*time.Second || lease < 3*time.Second-time.Second {
		t.Errorf("deadlines from updated_at: lease %v, TTL %v", lease, ttl)
	}
	if skew < 0 || skew > time.Minute {
		t.Errorf("updated_at is %v before the server's clock", skew)
	}
}

// TestInvalidArguments: what no record can be made from is refused before
// any statement, with an error that is neither a lost lease nor a corrupt
// record.
func TestInvalidArguments(t *testing.T) {
	s := newStore(t, newPool(t))
	key := randKey()
	for name, err := range map[string]error{
		"empty key":          func() error { _, err := s.Acquire(ctx, req("", "t")); return err }(),
		"empty token":        func() error { _, err := s.Acquire(ctx, req(key, "")); return err }(),
		"NUL in key":         func() error { _, err := s.Acquire(ctx, req("a\x00b", "t")); return err }(),
		"invalid UTF-8 key":  func() error { _, err := s.Acquire(ctx, req("a\xffb", "t")); return err }(),
		"key too long":       func() error { _, err := s.Acquire(ctx, req(strings.Repeat("k", 1025), "t")); return err }(),
		"zero lease":         func() error { r := req(key, "t"); r.Lease = 0; _, err := s.Acquire(ctx, r); return err }(),
		"negative TTL":       func() error { r := req(key, "t"); r.TTL = -time.Second; _, err := s.Acquire(ctx, r); return err }(),
		"Complete, zero TTL": s.Complete(ctx, key, "t", sampleResponse(), 0),
		"Complete, status 0": s.Complete(ctx, key, "t", &idempotency.Response{}, time.Hour),
		"Complete, nil":      s.Complete(ctx, key, "t", nil, time.Hour),
		"Extend, zero lease": s.Extend(ctx, key, "t", 0),
		"Release, empty key": s.Release(ctx, "", "t"),
		"Watch, empty key":   func() error { _, _, err := s.Watch(ctx, ""); return err }(),
	} {
		if err == nil || errors.Is(err, idempotency.ErrLeaseLost) || errors.Is(err, idempotency.ErrCorruptRecord) || !strings.HasPrefix(err.Error(), "pgstore: ") {
			t.Errorf("%s: error %v", name, err)
		}
	}
	// Nothing was written.
	mustAcquire(t, s, req(key, "u"), idempotency.Acquired)
}

func TestClosed(t *testing.T) {
	s := pgstore.New(newPool(t))
	key := randKey()
	mustAcquire(t, s, req(key, "t"), idempotency.Acquired)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	_, err := s.Acquire(ctx, req(key, "t"))
	_, _, werr := s.Watch(ctx, key)
	_, perr := s.Purge(ctx, 10)
	_, berr := s.BeginTx(ctx, key, "t")
	for name, err := range map[string]error{
		"Acquire": err, "Complete": s.Complete(ctx, key, "t", sampleResponse(), time.Hour),
		"Release": s.Release(ctx, key, "t"), "Extend": s.Extend(ctx, key, "t", time.Second),
		"Watch": werr, "Purge": perr, "BeginTx": berr,
	} {
		if !errors.Is(err, idempotency.ErrStoreClosed) {
			t.Errorf("%s after Close: %v, want ErrStoreClosed", name, err)
		}
	}
}

// rowText returns the record's row as text, to tell whether a call changed
// it.
func rowText(t *testing.T, pool *pgxpool.Pool, key string) string {
	t.Helper()
	var s string
	if err := pool.QueryRow(ctx, `SELECT r::text FROM idempotency_records r WHERE key = $1`, key).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestCorruptRecords plants rows that are not records, or whose payload
// cannot be read: every call reports an error wrapping ErrCorruptRecord or
// a plain refusal, and leaves the row exactly as it was.
func TestCorruptRecords(t *testing.T) {
	pool := newPool(t)
	s := newStore(t, pool)
	// The schema's CHECK keeps unknown states out; a table made by other
	// means may not have it.
	if _, err := pool.Exec(ctx, `ALTER TABLE idempotency_records DROP CONSTRAINT idempotency_records_state_check`); err != nil {
		t.Fatal(err)
	}
	complete := func(key string) {
		mustAcquire(t, s, req(key, "t"), idempotency.Acquired)
		if err := s.Complete(ctx, key, "t", sampleResponse(), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	plants := []struct {
		name, set  string
		inProgress bool // planted on an IN_PROGRESS record
	}{
		{"headers block of garbage", `headers = '\xdeadbeef'`, false},
		{"headers block truncated", `headers = substring(headers from 1 for 3)`, false},
		{"unknown meta version", `headers = '\x09' || substring(headers from 2)`, false},
		{"status disagrees with headers", `status = 200`, false},
		{"body_omitted disagrees with headers", `body_omitted = true`, false},
		{"headers NULL", `headers = NULL`, false},
		{"body NULL", `body = NULL`, false},
		{"unknown state", `state = 'paused'`, true},
		{"state of another case", `state = 'COMPLETE'`, false},
	}
	var faults, violations int64
	for _, p := range plants {
		t.Run(p.name, func(t *testing.T) {
			key := randKey()
			if p.inProgress {
				mustAcquire(t, s, req(key, "t"), idempotency.Acquired)
			} else {
				complete(key)
			}
			if _, err := pool.Exec(ctx, `UPDATE idempotency_records SET `+p.set+` WHERE key = $1`, key); err != nil {
				t.Fatal(err)
			}
			faults++
			before := rowText(t, pool, key)
			_, err := s.Acquire(ctx, req(key, "other"))
			if !errors.Is(err, idempotency.ErrCorruptRecord) {
				violations++
				t.Errorf("Acquire: %v, want ErrCorruptRecord", err)
			}
			if _, err := s.Acquire(ctx, req(key, "t")); !errors.Is(err, idempotency.ErrCorruptRecord) {
				violations++
				t.Errorf("Acquire by the token: %v, want ErrCorruptRecord", err)
			}
			unknown := strings.HasPrefix(p.set, "state")
			for op, err := range map[string]error{
				"Complete": s.Complete(ctx, key, "other", sampleResponse(), time.Hour),
				"Release":  s.Release(ctx, key, "other"),
				"Extend":   s.Extend(ctx, key, "other", time.Second),
			} {
				// A row in an unknown state is not a record; a COMPLETE
				// row with an unreadable payload is another token's record.
				if unknown && !errors.Is(err, idempotency.ErrCorruptRecord) ||
					!unknown && !errors.Is(err, idempotency.ErrLeaseLost) {
					violations++
					t.Errorf("%s: %v", op, err)
				}
			}
			if after := rowText(t, pool, key); after != before {
				violations++
				t.Errorf("the row changed:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
	reliability.Report(t, reliability.Result{Scenario: "fault: corrupt rows", Store: "postgres",
		Operations: faults * 5, Faults: faults, Violations: violations,
		Note: "unreadable payloads and unknown states: ErrCorruptRecord, the row untouched"})
}

// plantRow writes a record directly, its lease and TTL deadlines the given
// durations ago (negative: ahead): the store's own calls cannot make a
// deadline in the past. A COMPLETE one replays 201 with no headers or body.
func plantRow(t *testing.T, pool *pgxpool.Pool, key, state string, leaseAgo, ttlAgo time.Duration) {
	t.Helper()
	_, err := pool.Exec(ctx, `INSERT INTO idempotency_records
		(key, state, token, fingerprint, epoch, lease_until, ttl_until, updated_at, status, headers, body, body_omitted)
		SELECT $1, $2, 't', 'fp', 1, now() - $3::interval, now() - $4::interval, now(),
			CASE WHEN $2 = 'complete' THEN 201 END, CASE WHEN $2 = 'complete' THEN '\x01c9010000'::bytea END,
			CASE WHEN $2 = 'complete' THEN ''::bytea END, CASE WHEN $2 = 'complete' THEN false END`,
		key, state, leaseAgo, ttlAgo)
	if err != nil {
		t.Fatal(err)
	}
}

func keysLeft(t *testing.T, pool *pgxpool.Pool) map[string]bool {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT key FROM idempotency_records`)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]bool{}
	for _, k := range keys {
		m[k] = true
	}
	return m
}

// TestPurge: Purge deletes expired records in bounded batches and only
// them: an IN_PROGRESS record past its TTL whose lease still runs stays.
func TestPurge(t *testing.T) {
	pool := newPool(t)
	s := newStore(t, pool)
	const h = time.Hour
	plantRow(t, pool, "complete-expired-1", "complete", 2*h, time.Minute)
	plantRow(t, pool, "complete-expired-2", "complete", 2*h, time.Second)
	plantRow(t, pool, "in-progress-expired", "in_progress", time.Minute, time.Minute)
	plantRow(t, pool, "in-progress-live-lease", "in_progress", -time.Minute, time.Minute)
	plantRow(t, pool, "in-progress-live-ttl", "in_progress", time.Minute, -time.Minute)
	plantRow(t, pool, "complete-live", "complete", 2*h, -time.Minute)

	// The readable planted payload replays: the planted rows are records.
	mustAcquire(t, s, req("complete-live", "x"), idempotency.Completed)

	if _, err := s.Purge(ctx, 0); err == nil {
		t.Fatal("Purge(0) succeeded")
	}
	n, err := s.Purge(ctx, 2)
	if err != nil || n != 2 {
		t.Fatalf("Purge(2) = %d, %v; want 2", n, err)
	}
	n, err = s.Purge(ctx, 100)
	if err != nil || n != 1 {
		t.Fatalf("second Purge = %d, %v; want 1", n, err)
	}
	if n, err := s.Purge(ctx, 100); err != nil || n != 0 {
		t.Fatalf("third Purge = %d, %v; want 0", n, err)
	}
	left := keysLeft(t, pool)
	for _, k := range []string{"in-progress-live-lease", "in-progress-live-ttl", "complete-live"} {
		if !left[k] {
			t.Errorf("%s was purged", k)
		}
	}
	if len(left) != 3 {
		t.Errorf("left after purge: %v", left)
	}
}

// TestPurgeUsesIndex: with many live records, the purge reads the expiry
// index rather than the table.
func TestPurgeUsesIndex(t *testing.T) {
	pool := newPool(t)
	s := newStore(t, pool)
	if _, err := pool.Exec(ctx, `INSERT INTO idempotency_records
		(key, state, token, fingerprint, epoch, lease_until, ttl_until, updated_at, status, headers, body, body_omitted)
		SELECT 'k' || i, 'complete', 't', 'fp', 1, now(), now() + (i || ' seconds')::interval - interval '100 seconds', now(),
			201, '\x01c9010000', '', false
		FROM generate_series(1, 50000) i`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE idempotency_records`); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, "EXPLAIN "+pgstore.PurgeSQL(s), 1000)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	plan := strings.Join(lines, "\n")
	if !strings.Contains(plan, "Index Scan using idempotency_records_expires_at_idx") || strings.Contains(plan, "Seq Scan") {
		t.Fatalf("the purge does not walk the expiry index:\n%s", plan)
	}
	n, err := s.Purge(ctx, 1000)
	if err != nil || n < 90 || n > 101 {
		t.Fatalf("Purge = %d, %v; want the ~100 expired rows", n, err)
	}
}

// TestBackgroundPurge: WithPurgeInterval empties expired records in
// batches, reports errors to its handler, and Close stops it.
func TestBackgroundPurge(t *testing.T) {
	pool := newPool(t)
	for i := range 10 {
		plantRow(t, pool, fmt.Sprint("expired-", i), "complete", time.Hour, time.Minute)
	}
	errs := make(chan error, 100)
	s := pgstore.New(pool, pgstore.WithPurgeInterval(20*time.Millisecond), pgstore.WithPurgeBatch(3),
		pgstore.WithPurgeErrorHandler(func(err error) {
			select {
			case errs <- err:
			default:
			}
		}))
	defer s.Close()
	waitFor(t, 5*time.Second, "the background purge", func() bool { return len(keysLeft(t, pool)) == 0 })

	// Errors go to the handler.
	if _, err := pool.Exec(ctx, `ALTER TABLE idempotency_records RENAME TO gone`); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errs:
		if !strings.Contains(err.Error(), "pgstore: purge") {
			t.Errorf("purge error %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no purge error reported with the table gone")
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE gone RENAME TO idempotency_records`); err != nil {
		t.Fatal(err)
	}
	s.Close()
	plantRow(t, pool, "after-close", "complete", time.Hour, time.Minute)
	time.Sleep(200 * time.Millisecond) // ten intervals: only time shows that nothing runs
	if !keysLeft(t, pool)["after-close"] {
		t.Fatal("the purge ran after Close")
	}
}

// waitFor polls cond every 5ms until it holds, failing t after timeout.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestExpiredRecordsAreAbsent: a record past its deadlines is absent to every
// call before any purge: a fresh acquire at epoch 1 under any fingerprint,
// lost for Complete and Extend, nil for Release.
func TestExpiredRecordsAreAbsent(t *testing.T) {
	pool := newPool(t)
	s := newStore(t, pool)
	plantRow(t, pool, "in-progress", "in_progress", time.Second, time.Second)
	plantRow(t, pool, "complete", "complete", time.Hour, time.Second)
	for _, key := range []string{"in-progress", "complete"} {
		if err := s.Complete(ctx, key, "t", sampleResponse(), time.Hour); !errors.Is(err, idempotency.ErrLeaseLost) {
			t.Errorf("%s: Complete by the holder: %v", key, err)
		}
		if err := s.Extend(ctx, key, "t", time.Hour); !errors.Is(err, idempotency.ErrLeaseLost) {
			t.Errorf("%s: Extend by the holder: %v", key, err)
		}
		if err := s.Release(ctx, key, "t"); err != nil {
			t.Errorf("%s: Release: %v", key, err)
		}
		r := req(key, "new")
		r.Fingerprint = "another"
		a := mustAcquire(t, s, r, idempotency.Acquired)
		if a.Epoch != 1 {
			t.Errorf("%s: epoch %d", key, a.Epoch)
		}
	}
}

// TestFingerprintBytes: fingerprints are compared byte for byte, whatever
// the bytes (the middleware's are raw SHA-256 sums), and may be empty.
func TestFingerprintBytes(t *testing.T) {
	s := newStore(t, newPool(t))
	for _, fp := range []string{"", "\x00", "\x00\xff\xfe", string([]byte{0xc3, 0x28})} {
		key := randKey()
		r := req(key, "owner")
		r.Fingerprint = fp
		mustAcquire(t, s, r, idempotency.Acquired)
		if err := s.Complete(ctx, key, "owner", sampleResponse(), time.Hour); err != nil {
			t.Fatal(err)
		}
		dup := req(key, "dup")
		dup.Fingerprint = fp
		mustAcquire(t, s, dup, idempotency.Completed)
		dup.Fingerprint = fp + "\x00"
		mustAcquire(t, s, dup, idempotency.Mismatch)
	}
}
