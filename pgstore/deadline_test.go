package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/pgstore"
)

// TestDeadlines: with the server frozen (every byte held, connections
// open), every call returns by its context's deadline with an error that
// is neither a lost lease nor a corrupt record, on a connection in the
// pool and on a new one. Once the server answers again, the store works.
func TestDeadlines(t *testing.T) {
	url := pgtest.Database(t)
	setup := pgtest.PoolOn(t, url)
	if err := pgstore.Migrate(ctx, setup); err != nil {
		t.Fatal(err)
	}
	pool, proxy := pgtest.ProxiedPool(t, url, func(c *pgxpool.Config) { c.MaxConns = 4 })
	s := newStore(t, pool, pgstore.WithListenerHealthCheck(200*time.Millisecond))
	held, other := randKey(), randKey()
	mustAcquire(t, s, req(held, "owner"), idempotency.Acquired)
	mustAcquire(t, s, req(other, "owner"), idempotency.Acquired)

	const deadline = 200 * time.Millisecond
	calls := map[string]func(context.Context) error{
		"Acquire": func(ctx context.Context) error { _, err := s.Acquire(ctx, req(randKey(), "t")); return err },
		"Complete": func(ctx context.Context) error {
			return s.Complete(ctx, held, "owner", sampleResponse(), time.Hour)
		},
		"Release": func(ctx context.Context) error { return s.Release(ctx, other, "owner") },
		"Extend":  func(ctx context.Context) error { return s.Extend(ctx, held, "owner", time.Second) },
		"Watch":   func(ctx context.Context) error { _, _, err := s.Watch(ctx, held); return err },
		"Purge":   func(ctx context.Context) error { _, err := s.Purge(ctx, 100); return err },
		"BeginTx": func(ctx context.Context) error {
			tx, err := s.BeginTx(ctx, held, "owner")
			if err == nil {
				tx.Rollback(ctx)
			}
			return err
		},
	}
	proxy.Stall()
	var violations int64
	for name, call := range calls {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		start := time.Now()
		err := call(ctx)
		took := time.Since(start)
		cancel()
		if err == nil || errors.Is(err, idempotency.ErrLeaseLost) || errors.Is(err, idempotency.ErrCorruptRecord) {
			violations++
			t.Errorf("%s on a frozen server: %v", name, err)
		}
		if took > deadline+500*time.Millisecond {
			violations++
			t.Errorf("%s took %v with a %v deadline", name, took, deadline)
		}
	}
	proxy.Restore()
	waitFor(t, 10*time.Second, "the store to answer again", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := s.Acquire(ctx, req(randKey(), "t"))
		return err == nil
	})
	// The record is still the owner's: in progress, or COMPLETE if the
	// frozen Complete took effect after all. Its retry succeeds either way.
	if err := s.Complete(ctx, held, "owner", sampleResponse(), time.Hour); err != nil {
		t.Fatalf("Complete after the freeze: %v", err)
	}
	mustAcquire(t, s, req(held, "dup"), idempotency.Completed)
	reliability.Report(t, reliability.Result{Scenario: "fault: server frozen, calls bounded by their deadline", Store: "postgres",
		Operations: int64(len(calls)) + 2, Faults: 1, Violations: violations,
		Note: "every edge, Watch, Purge and BeginTx return by a 200ms deadline"})
}
