package pgstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/pgstore"
)

// An acquire that changes nothing (a replay, a mismatch, a duplicate of a
// watched record in flight, a row that is not a record) answers from the
// statement's snapshot: it locks no row, writes nothing and takes no
// transaction id. An acquire that changes the record (a fresh record, a
// steal, the holder's retry, marking a record in flight as watched) does
// all three, on the latest version of the row.

// acquireCase is a record and an acquire of it.
type acquireCase struct {
	name string
	// setup makes the record at key.
	setup func(t *testing.T, s *pgstore.Store, pool *pgxpool.Pool, key string)
	// dup is the acquire, by a token of its own, with fingerprint "fp"
	// unless fp is set.
	fp string
	// want is the outcome; 0 stands for ErrCorruptRecord.
	want idempotency.AcquireOutcome
	// code is what the statement answers.
	code int
	// writes: the acquire changes the row.
	writes bool
}

func completed(t *testing.T, s *pgstore.Store, _ *pgxpool.Pool, key string) {
	t.Helper()
	mustAcquire(t, s, req(key, "owner"), idempotency.Acquired)
	if err := s.Complete(ctx, key, "owner", sampleResponse(), time.Hour); err != nil {
		t.Fatal(err)
	}
}

func inFlight(watched bool) func(*testing.T, *pgstore.Store, *pgxpool.Pool, string) {
	return func(t *testing.T, s *pgstore.Store, pool *pgxpool.Pool, key string) {
		t.Helper()
		mustAcquire(t, s, req(key, "owner"), idempotency.Acquired)
		if _, err := pool.Exec(ctx, `UPDATE idempotency_records SET watched = $2 WHERE key = $1`, key, watched); err != nil {
			t.Fatal(err)
		}
	}
}

var acquireCases = []acquireCase{
	{name: "replay", setup: completed,
		want: idempotency.Completed, code: pgstore.AcquireCompleted},
	{name: "mismatch of a COMPLETE record", setup: completed, fp: "other",
		want: idempotency.Mismatch, code: pgstore.AcquireMismatch},
	{name: "mismatch of a record in flight", setup: inFlight(false), fp: "other",
		want: idempotency.Mismatch, code: pgstore.AcquireMismatch},
	{name: "in flight, watched", setup: inFlight(true),
		want: idempotency.InFlight, code: pgstore.AcquireInFlight},
	{name: "not a record", setup: func(t *testing.T, s *pgstore.Store, pool *pgxpool.Pool, key string) {
		completed(t, s, pool, key)
		if _, err := pool.Exec(ctx, `UPDATE idempotency_records SET state = 'paused' WHERE key = $1`, key); err != nil {
			t.Fatal(err)
		}
	}, code: pgstore.CodeCorrupt},

	{name: "absent", setup: func(*testing.T, *pgstore.Store, *pgxpool.Pool, string) {},
		want: idempotency.Acquired, code: pgstore.AcquireTaken, writes: true},
	{name: "COMPLETE past its TTL", setup: func(t *testing.T, _ *pgstore.Store, pool *pgxpool.Pool, key string) {
		plantRow(t, pool, key, "complete", time.Hour, time.Second)
	}, want: idempotency.Acquired, code: pgstore.AcquireTaken, writes: true},
	{name: "lease run out", setup: func(t *testing.T, _ *pgstore.Store, pool *pgxpool.Pool, key string) {
		plantRow(t, pool, key, "in_progress", time.Second, -time.Hour)
	}, want: idempotency.Stolen, code: pgstore.AcquireTaken, writes: true},
	{name: "in flight, not yet watched", setup: inFlight(false),
		want: idempotency.InFlight, code: pgstore.AcquireInFlight, writes: true},
}

// newReadOnlyPool returns a pool whose table takes rows that are not
// records (its CHECK on the state is gone).
func newReadOnlyPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := newPool(t, func(c *pgxpool.Config) { c.MaxConns = 12 })
	if _, err := pool.Exec(ctx, `ALTER TABLE idempotency_records DROP CONSTRAINT idempotency_records_state_check`); err != nil {
		t.Fatal(err)
	}
	return pool
}

// rowVersion returns the row's system columns (its version and locker),
// or "" when there is no row.
func rowVersion(t *testing.T, pool *pgxpool.Pool, key string) string {
	t.Helper()
	var v string
	err := pool.QueryRow(ctx, `SELECT coalesce((SELECT format('%s %s %s', ctid, xmin, xmax)
		FROM idempotency_records WHERE key = $1), '')`, key).Scan(&v)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func checkOutcome(t *testing.T, c acquireCase, a idempotency.Acquisition, err error) {
	t.Helper()
	if c.want == 0 {
		if !errors.Is(err, idempotency.ErrCorruptRecord) {
			t.Errorf("Acquire: %+v, %v; want ErrCorruptRecord", a, err)
		}
		return
	}
	if err != nil || a.Outcome != c.want {
		t.Errorf("Acquire: %+v, %v; want %v", a, err, c.want)
		return
	}
	if c.want == idempotency.InFlight && (a.Epoch != 1 || a.LeaseRemaining <= 0 || a.LeaseRemaining > 10*time.Second) {
		t.Errorf("in flight at epoch %d with %v left; want epoch 1 and at most 10s", a.Epoch, a.LeaseRemaining)
	}
	if c.want == idempotency.Completed && (a.Response == nil || a.Response.Status != 201) {
		t.Errorf("replayed %+v", a.Response)
	}
}

// TestAcquireTransactionID runs the acquire statement inside a
// transaction and asks the server whether it assigned a transaction id:
// never for an acquire that changes nothing, always for one that changes
// the record. Through the store, the row's version and locker (ctid, xmin,
// xmax) stay as they were exactly when nothing changes: a statement that
// locked the row would set xmax.
func TestAcquireTransactionID(t *testing.T) {
	pool := newReadOnlyPool(t)
	s := newStore(t, pool)
	for _, c := range acquireCases {
		t.Run(c.name, func(t *testing.T) {
			r := req(randKey(), "dup")
			if c.fp != "" {
				r.Fingerprint = c.fp
			}
			c.setup(t, s, pool, r.Key)

			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			code, err := pgstore.AcquireCode(ctx, s, tx, r)
			if err != nil || code != c.code {
				t.Fatalf("statement answered %d, %v; want %d", code, err, c.code)
			}
			var assigned bool
			if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id_if_assigned() IS NOT NULL`).Scan(&assigned); err != nil {
				t.Fatal(err)
			}
			if assigned != c.writes {
				t.Errorf("transaction id assigned: %v; want %v", assigned, c.writes)
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}

			before := rowVersion(t, pool, r.Key)
			a, err := s.Acquire(ctx, r)
			checkOutcome(t, c, a, err)
			if after := rowVersion(t, pool, r.Key); (after != before) != c.writes {
				t.Errorf("row version and locker %q before, %q after the acquire; changed: want %v", before, after, c.writes)
			}
		})
	}
}

// TestAcquireIgnoresRowLock holds the record's row with SELECT ... FOR
// UPDATE in another transaction, as a transactional completion or a steal
// does while it commits. Acquires that change nothing, eight at once,
// answer while the lock is held; an acquire that must mark the record as
// watched waits for the lock, and marks it once the lock is gone.
func TestAcquireIgnoresRowLock(t *testing.T) {
	pool := newReadOnlyPool(t)
	s := newStore(t, pool)
	for _, c := range acquireCases {
		if c.writes && c.name != "in flight, not yet watched" {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			key := randKey()
			c.setup(t, s, pool, key)
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			var one int
			if err := tx.QueryRow(ctx, `SELECT 1 FROM idempotency_records WHERE key = $1 FOR UPDATE`, key).Scan(&one); err != nil {
				t.Fatal(err)
			}
			if c.writes {
				dup := acquireAsync(s, req(key, "dup"))
				waitingOnLocks(t, pool, 1)
				select {
				case res := <-dup:
					t.Fatalf("the acquire answered %+v, %v while the row was locked", res.a, res.err)
				default:
				}
				if err := tx.Rollback(ctx); err != nil {
					t.Fatal(err)
				}
				res := <-dup
				checkOutcome(t, c, res.a, res.err)
				if !rowWatched(t, pool, key) {
					t.Error("the record is not watched")
				}
				return
			}
			const dups = 8
			results := make(chan acquireResult, dups)
			bounded, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			for i := range dups {
				go func() {
					r := req(key, "dup"+string(rune('a'+i)))
					if c.fp != "" {
						r.Fingerprint = c.fp
					}
					a, err := s.Acquire(bounded, r)
					results <- acquireResult{a, err}
				}()
			}
			for range dups {
				res := <-results
				checkOutcome(t, c, res.a, res.err)
			}
			// The lock was held throughout: the acquires did not wait for it.
			var held bool
			if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id_if_assigned() IS NOT NULL`).Scan(&held); err != nil || !held {
				t.Fatalf("the locking transaction has no transaction id (%v, %v)", held, err)
			}
		})
	}
}

// TestAcquireWritesOnlyWhenNeeded replaces the acquire function that the
// schema installs with one that fails: the acquires that change nothing
// still answer, since their statement never calls it, and every acquire
// that must change the record fails with the function's error.
func TestAcquireWritesOnlyWhenNeeded(t *testing.T) {
	pool := newReadOnlyPool(t)
	s := newStore(t, pool)
	// Records first (their acquires write), then the failing function.
	type prepared struct {
		c acquireCase
		r idempotency.AcquireRequest
	}
	var cases []prepared
	for _, c := range acquireCases {
		r := req(randKey(), "dup")
		if c.fp != "" {
			r.Fingerprint = c.fp
		}
		c.setup(t, s, pool, r.Key)
		cases = append(cases, prepared{c, r})
	}
	if _, err := pool.Exec(ctx, `CREATE OR REPLACE FUNCTION idempotency_records_acquire(
		p_key text, p_token text, p_fingerprint bytea, p_lease interval, p_ttl interval, n timestamptz)
		RETURNS bigint[]
		LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'the write ran'; END $$`); err != nil {
		t.Fatal(err)
	}
	for _, p := range cases {
		t.Run(p.c.name, func(t *testing.T) {
			a, err := s.Acquire(ctx, p.r)
			if p.c.writes {
				if err == nil || !strings.Contains(err.Error(), "the write ran") {
					t.Errorf("Acquire: %+v, %v; want the function's error", a, err)
				}
				return
			}
			checkOutcome(t, p.c, a, err)
		})
	}
}

// TestAcquirePlan: the plan of the acquire statement holds no INSERT (no
// ModifyTable node), so an acquire that changes nothing does not pay for
// setting one up: it is a read of the row by primary key.
func TestAcquirePlan(t *testing.T) {
	pool := newPool(t)
	s := newStore(t, pool)
	r := req(randKey(), "dup")
	completed(t, s, pool, r.Key)
	var plan string
	if err := pool.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+pgstore.AcquireSQL(s),
		r.Key, r.Token, []byte(r.Fingerprint), r.Lease, r.TTL).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(plan, `"Index Name": "idempotency_records_pkey"`) {
		t.Errorf("the plan reads no row by primary key:\n%s", plan)
	}
	for _, node := range []string{"ModifyTable", "CTE Scan", "Append"} {
		if strings.Contains(plan, `"Node Type": "`+node+`"`) {
			t.Errorf("the plan holds a %s node:\n%s", node, plan)
		}
	}
}
