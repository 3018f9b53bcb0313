package pgstore_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/pgstore"
)

// These tests hold a transaction open on a record's row, start a call that
// must wait for the row, and commit: the call then judges a version of the
// row that its statement's snapshot does not show. They pin down the paths
// that a race between two calls on one key takes.

// waitingOnLocks waits until n backends of the database wait for a lock.
func waitingOnLocks(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	waitFor(t, 5*time.Second, "a call to wait for the row lock", func() bool {
		var waiting int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		return waiting >= n
	})
}

type acquireResult struct {
	a   idempotency.Acquisition
	err error
}

func acquireAsync(s *pgstore.Store, r idempotency.AcquireRequest) <-chan acquireResult {
	ch := make(chan acquireResult, 1)
	go func() {
		a, err := s.Acquire(ctx, r)
		ch <- acquireResult{a, err}
	}()
	return ch
}

// TestRaceNewKey: a first request's INSERT has not committed when a
// duplicate arrives. The duplicate's INSERT waits for it and then judges
// the new row, which its statement's snapshot does not show. Unwatched,
// the row is marked watched by the duplicate (one statement); watched, the
// duplicate's statement changes nothing, finds no row in its snapshot and
// runs again. Either way it reports the record in flight at epoch 1.
func TestRaceNewKey(t *testing.T) {
	for _, watched := range []bool{false, true} {
		t.Run(map[bool]string{false: "unwatched", true: "watched"}[watched], func(t *testing.T) {
			pool := newPool(t)
			s := newStore(t, pool)
			key := randKey()
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, `INSERT INTO idempotency_records
				(key, state, token, fingerprint, epoch, lease_until, ttl_until, updated_at, watched)
				VALUES ($1, 'in_progress', 'first', 'fp', 1, now() + interval '10 seconds', now() + interval '1 hour', now(), $2)`,
				key, watched); err != nil {
				t.Fatal(err)
			}
			retries := s.Retries()
			dup := acquireAsync(s, req(key, "second"))
			waitingOnLocks(t, pool, 1)
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			res := <-dup
			if res.err != nil || res.a.Outcome != idempotency.InFlight || res.a.Epoch != 1 {
				t.Fatalf("duplicate: %+v, %v; want in_flight at epoch 1", res.a, res.err)
			}
			if ran := s.Retries() - retries; ran != map[bool]int64{false: 0, true: 1}[watched] {
				t.Fatalf("the duplicate ran its statement %d more times", ran)
			}
			if !rowWatched(t, pool, key) {
				t.Fatal("the record is not watched after an in-flight duplicate")
			}
		})
	}
}

func rowWatched(t *testing.T, pool *pgxpool.Pool, key string) bool {
	t.Helper()
	var w bool
	if err := pool.QueryRow(ctx, `SELECT watched FROM idempotency_records WHERE key = $1`, key).Scan(&w); err != nil {
		t.Fatal(err)
	}
	return w
}

// TestRaceSteal: two duplicates find an expired lease; the first steal has
// not committed when the second arrives. The second reports the thief's
// lease in flight at epoch 2, never a second steal: judging the thief's
// row (unwatched), or running again (watched).
func TestRaceSteal(t *testing.T) {
	for _, watched := range []bool{false, true} {
		t.Run(map[bool]string{false: "unwatched", true: "watched"}[watched], func(t *testing.T) {
			pool := newPool(t)
			s := newStore(t, pool)
			key := randKey()
			r := req(key, "owner")
			r.Lease = 20 * time.Millisecond
			mustAcquire(t, s, r, idempotency.Acquired)
			if _, err := pool.Exec(ctx, `UPDATE idempotency_records SET watched = $2 WHERE key = $1`, key, watched); err != nil {
				t.Fatal(err)
			}
			time.Sleep(40 * time.Millisecond) // the lease must run out on the server's clock

			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, `UPDATE idempotency_records SET token = 'thief', epoch = 2,
				lease_until = now() + interval '10 seconds' WHERE key = $1`, key); err != nil {
				t.Fatal(err)
			}
			retries := s.Retries()
			late := acquireAsync(s, req(key, "late"))
			waitingOnLocks(t, pool, 1)
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			res := <-late
			if res.err != nil || res.a.Outcome != idempotency.InFlight || res.a.Epoch != 2 {
				t.Fatalf("late duplicate: %+v, %v; want in_flight at epoch 2", res.a, res.err)
			}
			if ran := s.Retries() - retries; ran != map[bool]int64{false: 0, true: 1}[watched] {
				t.Fatalf("the late duplicate ran its statement %d more times", ran)
			}
			if err := s.Complete(ctx, key, "owner", sampleResponse(), time.Hour); !errors.Is(err, idempotency.ErrLeaseLost) {
				t.Fatalf("the old owner's Complete: %v", err)
			}
		})
	}
}

// TestRaceCompleteInTransaction: a transactional Complete holds the row
// (its fence ran, its COMMIT has not) while a duplicate, a retried Complete,
// a Release and an Extend of the same token arrive. All wait for the
// COMMIT. The duplicate's snapshot shows the record in progress and
// unwatched, which its statement would have marked: it runs again and
// replays. The retried Complete succeeds without writing; Release and
// Extend are refused.
func TestRaceCompleteInTransaction(t *testing.T) {
	pool := newPool(t, func(c *pgxpool.Config) { c.MaxConns = 8 })
	s := pgstore.New(pool)
	defer s.Close()
	hold, held := make(chan struct{}), make(chan struct{})
	pgstore.SetBeforeCommit(s, func(*pgstore.Tx) {
		close(held)
		<-hold
	})
	key := randKey()
	mustAcquire(t, s, req(key, "owner"), idempotency.Acquired)
	tx, err := s.BeginTx(ctx, key, "owner")
	if err != nil {
		t.Fatal(err)
	}
	completed := make(chan error, 1)
	go func() { completed <- tx.Complete(ctx, sampleResponse(), time.Hour) }()
	<-held

	retries := s.Retries()
	dup := acquireAsync(s, req(key, "dup"))
	var wg sync.WaitGroup
	var retryErr, releaseErr, extendErr error
	wg.Add(3)
	go func() { defer wg.Done(); retryErr = s.Complete(ctx, key, "owner", sampleResponse(), time.Hour) }()
	go func() { defer wg.Done(); releaseErr = s.Release(ctx, key, "owner") }()
	go func() { defer wg.Done(); extendErr = s.Extend(ctx, key, "owner", time.Second) }()
	waitingOnLocks(t, pool, 4)
	close(hold)
	if err := <-completed; err != nil {
		t.Fatalf("transactional Complete: %v", err)
	}
	res := <-dup
	wg.Wait()
	if res.err != nil || res.a.Outcome != idempotency.Completed || res.a.Response.Status != 201 {
		t.Fatalf("duplicate: %+v, %v; want the replay", res.a, res.err)
	}
	if retryErr != nil {
		t.Errorf("retried Complete by the completer: %v", retryErr)
	}
	if !errors.Is(releaseErr, idempotency.ErrLeaseLost) || !errors.Is(extendErr, idempotency.ErrLeaseLost) {
		t.Errorf("Release %v, Extend %v; want ErrLeaseLost", releaseErr, extendErr)
	}
	if s.Retries() == retries {
		t.Error("no call ran its statement again")
	}
	if err := tx.Rollback(context.Background()); err != nil {
		t.Errorf("Rollback after Complete: %v", err)
	}
}
