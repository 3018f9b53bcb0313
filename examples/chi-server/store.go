package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/memstore"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/outbox/relay"
	"github.com/go-idempotency/idempotency/pgstore"
	"github.com/go-idempotency/idempotency/redisstore"
	"github.com/go-idempotency/idempotency/state"
)

// backend is where the server keeps its idempotency records and, in
// PostgreSQL and SQLite modes, its payments, their state records and
// their outbox: the engine is chosen here, at start-up, and the handlers
// are the same in both modes.
type backend struct {
	store idempotency.Store
	name  string // what the banner prints: "memstore", "redis host:port", "postgres host:port/db", "sqlite FILE"
	// payments, states and relay are those of the PostgreSQL and SQLite
	// modes, nil otherwise: the payments table, the payments' state
	// records, and a relay of the database's outbox through a sink.
	payments *paymentsTable
	states   *state.Store
	relay    func(sink outbox.Sink, opts ...relay.Option) *relay.Relay
	db       *pgxpool.Pool // PostgreSQL mode; nil otherwise
	file     string        // SQLite mode (sqlite.go): the file's path
	close    func()
}

// openBackend chooses the store from the server's settings: Redis when
// redisAddr is set (host:port of a single node), else PostgreSQL when
// databaseURL is set, else the in-memory store. REDIS_ADDR takes
// precedence over DATABASE_URL, which is then not used at all. Two
// servers sharing one Redis, or one database, replay each other's
// responses.
func openBackend(ctx context.Context, redisAddr, databaseURL string, logger *slog.Logger) (*backend, error) {
	switch {
	case redisAddr != "":
		return openRedis(ctx, redisAddr)
	case databaseURL != "":
		return openPostgres(ctx, databaseURL, logger)
	}
	s := memstore.New()
	return &backend{store: s, name: "memstore", close: func() { _ = s.Close() }}, nil
}

func openRedis(ctx context.Context, addr string) (*backend, error) {
	client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("redis at %s: %w", addr, err)
	}
	s := redisstore.New(client, redisstore.WithPrefix("chi-server:"))
	return &backend{store: s, name: "redis " + addr, close: func() { _ = s.Close(); _ = client.Close() }}, nil
}

// openPostgres connects to the database at url, creates the store's table
// (pgstore.Migrate) and the payments table, and starts the store with a
// purge of expired records every minute. A transactional request holds one
// of the pool's connections while its handler runs: size the pool with
// pool_max_conns in the URL (pgxpool's default is 4, or the number of
// CPUs when larger).
func openPostgres(ctx context.Context, url string, logger *slog.Logger) (*backend, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	where := net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))) + "/" + cfg.ConnConfig.Database
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres at %s: %w", where, err)
	}
	if err := pgstore.Migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres at %s: %w", where, err)
	}
	if err := migratePayments(ctx, pool); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres at %s: payments table: %w", where, err)
	}
	s := pgstore.New(pool,
		pgstore.WithPurgeInterval(time.Minute),
		pgstore.WithPurgeErrorHandler(func(err error) { logger.Warn("purging expired idempotency records", "error", err) }))
	return &backend{
		store:    s,
		name:     "postgres " + where,
		payments: &paymentsTable{sql: postgresPayments, db: lifecycle.Pgx(pool), tx: pgTx},
		states:   state.New(pool),
		relay:    func(sink outbox.Sink, opts ...relay.Option) *relay.Relay { return relay.New(pool, sink, opts...) },
		db:       pool,
		close:    func() { _ = s.Close(); pool.Close() },
	}, nil
}

// pgTx returns the transaction of the request or local run whose context
// ctx is, on a pgstore.Store.
func pgTx(ctx context.Context) (lifecycle.DB, bool) {
	tx, ok := pgstore.TxFromContext(ctx)
	if !ok {
		return nil, false
	}
	return lifecycle.Pgx(tx), true
}

// paymentsSchema is the payments table of the PostgreSQL mode. The
// client's key is kept with each payment for reference, without a unique
// constraint: a key may come back after its record's TTL for another
// payment, and the middleware is what makes each payment once (the tests
// count the rows).
//
// A payment is authorized, its capture scheduled as the outbox message
// capture_id, due at capture_at; then captured (at capture_at) or
// canceled. Without scheduled captures it is captured as it is made.
const paymentsSchema = `
CREATE TABLE IF NOT EXISTS payments (
	id              bigserial   PRIMARY KEY,
	user_name       text        NOT NULL,
	idempotency_key text        NOT NULL,
	amount          bigint      NOT NULL CHECK (amount > 0),
	currency        text        NOT NULL,
	created         timestamptz NOT NULL DEFAULT now(),
	status          text        NOT NULL DEFAULT 'captured' CHECK (status IN ('authorized', 'captured', 'canceled')),
	capture_id      text,
	capture_at      timestamptz
)`

// postgresPayments are the statements of the payments table of the
// PostgreSQL mode.
var postgresPayments = paymentsSQL{
	insert: `INSERT INTO payments (user_name, idempotency_key, amount, currency, status, capture_at)
		VALUES ($1, $2, $3, $4, $5, coalesce($6, now())) RETURNING id, created, capture_at`,
	schedule: `UPDATE payments SET capture_id = $2 WHERE id = $1`,
	settle: `UPDATE payments
		SET status = $2, capture_at = CASE WHEN $2 = 'captured' THEN now() END
		WHERE id = $1
		RETURNING user_name, amount, currency, created, status, capture_at, capture_id`,
	read:  `SELECT user_name, amount, currency, created, status, capture_at FROM payments WHERE id = $1`,
	count: `SELECT count(*) FROM payments`,
}

// migratePayments creates the payments table if it is missing, in one
// transaction under an advisory lock, so that servers starting together
// do not race (as pgstore.Migrate does for its own table).
func migratePayments(ctx context.Context, pool *pgxpool.Pool) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('chi-server payments'))`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, paymentsSchema)
		return err
	})
}
