package replaycache_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/memstore"
	"github.com/go-idempotency/idempotency/pgstore"
	"github.com/go-idempotency/idempotency/replaycache"
	"github.com/go-idempotency/idempotency/storetest"
)

// TestConformance runs the Store contract through one cache in front of
// one memstore, shared by all subtests as an application shares them.
func TestConformance(t *testing.T) {
	s := memstore.New()
	t.Cleanup(func() { s.Close() })
	c := replaycache.New(s)
	wantHits(t, c)
	storetest.Run(t, func(t *testing.T) idempotency.Store { return c })
}

// TestConformancePostgres runs the Store contract through a TxCache in
// front of pgstore.
func TestConformancePostgres(t *testing.T) {
	s, _ := newPgStore(t)
	c := replaycache.NewTx(s)
	wantHits(t, c.Cache)
	storetest.Run(t, func(t *testing.T) idempotency.Store { return c })
}

// wantHits checks, once the parallel subtests are done, that the cache
// answered some of them.
func wantHits(t *testing.T, c *replaycache.Cache) {
	t.Cleanup(func() {
		if st := c.Stats(); st.Hits == 0 {
			t.Errorf("Stats = %+v: the suite never replayed from the cache", st)
		}
	})
}

// newPgStore returns a pgstore on a database of its own (see pgtest),
// closed when t ends, and its pool; the test is skipped without a server.
func newPgStore(t *testing.T) (*pgstore.Store, *pgxpool.Pool) {
	t.Helper()
	pool := pgtest.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 16 })
	if err := pgstore.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	s := pgstore.New(pool)
	t.Cleanup(func() { s.Close() })
	return s, pool
}
