package state_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/pgstore"
	"github.com/go-idempotency/idempotency/state"
	"github.com/go-idempotency/idempotency/state/statetest"
)

// TestConformance runs the conformance suite on PostgreSQL: one database,
// migrated by pgstore.Migrate, shared by the subtests, and a
// transactional Runner over pgstore on it.
func TestConformance(t *testing.T) {
	pool := pgtest.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 16 })
	if err := pgstore.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	store := pgstore.New(pool)
	t.Cleanup(func() { store.Close() })
	runner := idempotency.NewRunner(store, idempotency.WithTransaction(true))
	statetest.Run(t, func(t *testing.T) statetest.Target {
		return statetest.Target{
			NewStore: func(opts ...state.Option) *state.Store { return state.New(pool, opts...) },
			Runner:   runner,
		}
	})
}
