package idemnats_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/memstore"
	"github.com/go-idempotency/idempotency/pgstore"
	"github.com/go-idempotency/idempotency/redisstore"
)

func newMemStore(t testing.TB, opts ...memstore.Option) *memstore.Store {
	t.Helper()
	s := memstore.New(opts...)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// effectsTable is the table the transactional tests' handlers write to. It
// has no unique constraint, so that a second execution would show as a
// second row.
const effectsTable = `CREATE TABLE IF NOT EXISTS effects (key text NOT NULL, epoch bigint NOT NULL, pid int NOT NULL)`

// pgDatabase creates a database of its own for t (see pgtest) with the
// store's table and the effects table, and returns its URL.
func pgDatabase(t testing.TB) string {
	t.Helper()
	url := pgtest.Database(t)
	pool := pgtest.PoolOn(t, url)
	ctx := context.Background()
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, effectsTable); err != nil {
		t.Fatal(err)
	}
	return url
}

// newPGStore returns a pgstore on the database at url, and its pool, both
// closed when t ends.
func newPGStore(t testing.TB, url string) (*pgstore.Store, *pgxpool.Pool) {
	t.Helper()
	pool := pgtest.PoolOn(t, url)
	s := pgstore.New(pool)
	t.Cleanup(func() { _ = s.Close() })
	return s, pool
}

// newRedisStore returns a redisstore on the server at addr under a prefix
// of its own.
func newRedisStore(t testing.TB, addr, prefix string) *redisstore.Store {
	t.Helper()
	client := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = client.Close() })
	s := redisstore.New(client, redisstore.WithPrefix(prefix))
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// redisAddr returns the address of a Redis server for t (see redistest).
func redisAddr(t testing.TB) string {
	t.Helper()
	return redistest.Addr(t)
}
