package reliability_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/pgstore"
)

// newPgStore returns a pgstore on a database of its own (see pgtest),
// closed when t ends.
func newPgStore(t testing.TB, opts ...pgstore.Option) *pgstore.Store {
	t.Helper()
	pool := pgtest.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 16 })
	if err := pgstore.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	s := pgstore.New(pool, opts...)
	t.Cleanup(func() { s.Close() })
	return s
}

func TestSoakPostgres(t *testing.T) {
	soak(t, "postgres", newPgStore(t), soakDuration(t), false)
}
