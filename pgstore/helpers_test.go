package pgstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/pgstore"
)

var ctx = context.Background()

// newPool returns a pool on a database of its own for t, with the store's
// table created.
func newPool(t testing.TB, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	pool := pgtest.Pool(t, configure...)
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	return pool
}

// newStore returns a Store on pool, closed when t ends.
func newStore(t testing.TB, pool *pgxpool.Pool, opts ...pgstore.Option) *pgstore.Store {
	t.Helper()
	s := pgstore.New(pool, opts...)
	t.Cleanup(func() { s.Close() })
	return s
}

func randKey() string {
	var b [32]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func req(key, token string) idempotency.AcquireRequest {
	return idempotency.AcquireRequest{Key: key, Token: token, Fingerprint: "fp", Lease: 10 * time.Second, TTL: time.Hour}
}

func mustAcquire(t testing.TB, s idempotency.Store, r idempotency.AcquireRequest, want idempotency.AcquireOutcome) idempotency.Acquisition {
	t.Helper()
	a, err := s.Acquire(ctx, r)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if a.Outcome != want {
		t.Fatalf("Acquire outcome %v, want %v (%+v)", a.Outcome, want, a)
	}
	return a
}

func sampleResponse() *idempotency.Response {
	return &idempotency.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}},
		Body:   []byte(`{"id":"pay_1"}`),
	}
}

// newPoolOn returns a pool of at most maxConns connections on the database
// at url.
func newPoolOn(t *testing.T, url string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	return pgtest.PoolOn(t, url, func(c *pgxpool.Config) { c.MaxConns = maxConns })
}

// migratedIn returns a pool on a database of its own in which schema
// "billing" exists and Migrate has run with WithTable("billing."+name),
// and that option.
func migratedIn(t *testing.T, name string) (*pgxpool.Pool, pgstore.Option) {
	t.Helper()
	pool := pgtest.Pool(t)
	if _, err := pool.Exec(ctx, `CREATE SCHEMA billing`); err != nil {
		t.Fatal(err)
	}
	opt := pgstore.WithTable("billing." + name)
	if err := pgstore.Migrate(ctx, pool, opt); err != nil {
		t.Fatal(err)
	}
	return pool, opt
}
