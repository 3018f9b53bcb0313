package pgstore_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/pgstore"
	"github.com/go-idempotency/idempotency/storetest"
)

// TestConformance runs the Store contract against one Store (and one
// database) shared by all subtests, as an application shares it.
func TestConformance(t *testing.T) {
	pool := newPool(t, func(c *pgxpool.Config) { c.MaxConns = 16 })
	s := newStore(t, pool)
	storetest.Run(t, func(t *testing.T) idempotency.Store { return s })
}

// TestConformanceStoresSharingATable runs the contract against a new Store
// per subtest, all on one table: records, leases and notifications are
// shared through the database, not through a Store's memory.
func TestConformanceStoresSharingATable(t *testing.T) {
	pool := newPool(t, func(c *pgxpool.Config) { c.MaxConns = 16 })
	storetest.Run(t, func(t *testing.T) idempotency.Store {
		s := pgstore.New(pool)
		t.Cleanup(func() { s.Close() })
		return s
	})
}

// TestConformanceSimpleProtocol runs the contract with pgx's simple
// protocol (arguments interpolated client-side), as pools behind poolers
// that do not keep prepared statements are set up.
func TestConformanceSimpleProtocol(t *testing.T) {
	pool := newPool(t, func(c *pgxpool.Config) {
		c.MaxConns = 16
		c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	})
	s := newStore(t, pool)
	storetest.Run(t, func(t *testing.T) idempotency.Store { return s })
}
