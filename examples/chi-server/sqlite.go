package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/outbox/relay"
	"github.com/go-idempotency/idempotency/sqlitestore"
)

// SQLite mode (-sqlite FILE, or $SQLITE_PATH): the idempotency records,
// the payments, their state records and their outbox live in one SQLite
// file, the store's tables (package sqlitestore) beside a payments
// table, so that the server keeps them all across a restart with no other
// server running. The handlers are PostgreSQL mode's: each payment is a
// row inserted in the request's transaction with its state record and its
// scheduled capture, the row, the record, the message and the key's
// record committing together, or none of them; the store's relay
// (Store.Relay) runs the captures as they fall due, from the file, so a
// capture scheduled before a restart runs after it; captures and cancels
// are transitions of the state records (Store.States).
//
// SQLite lets one transaction write at a time: a transactional request
// holds the file's write lock while its handler runs (a slow payment's
// ?delay= included), and the payments, captures and cancels of other keys
// wait for it, the relay's runs of the captures too (a duplicate of its
// own key does not: it reads the record, and gets 409 or waits). A
// request whose transaction cannot begin within a third of the lease is
// answered 503 and its key released. Of a capture and a cancel sent at
// once the first to take the lock wins, and the other finds the payment
// settled: 409 state_conflict, as in PostgreSQL mode.

// sqlitePaymentsSchema is the payments table of the SQLite mode: the
// PostgreSQL mode's, its times in INTEGER unix microseconds as the
// outbox's and the state records' on the file. As there, the client's
// key is kept for reference, without a unique constraint.
const sqlitePaymentsSchema = `
CREATE TABLE IF NOT EXISTS payments (
	id              INTEGER PRIMARY KEY,
	user_name       TEXT    NOT NULL,
	idempotency_key TEXT    NOT NULL,
	amount          INTEGER NOT NULL CHECK (amount > 0),
	currency        TEXT    NOT NULL,
	created         INTEGER NOT NULL,
	status          TEXT    NOT NULL DEFAULT 'captured' CHECK (status IN ('authorized', 'captured', 'canceled')),
	capture_id      TEXT,
	capture_at      INTEGER
)`

// sqliteNow is the file's clock in unix microseconds, read once per
// statement: the outbox's edges' (lifecycle.SQLite).
var sqliteNow = lifecycle.SQLite.Now

// sqlitePayments are the statements of the payments table of the SQLite
// mode.
var sqlitePayments = paymentsSQL{
	insert: `INSERT INTO payments (user_name, idempotency_key, amount, currency, status, created, capture_at)
		VALUES (?1, ?2, ?3, ?4, ?5, ` + sqliteNow + `, coalesce(?6, ` + sqliteNow + `)) RETURNING id, created, capture_at`,
	schedule: `UPDATE payments SET capture_id = ?2 WHERE id = ?1`,
	settle: `UPDATE payments
		SET status = ?2, capture_at = CASE WHEN ?2 = 'captured' THEN ` + sqliteNow + ` END
		WHERE id = ?1
		RETURNING user_name, amount, currency, created, status, capture_at, capture_id`,
	read:  `SELECT user_name, amount, currency, created, status, capture_at FROM payments WHERE id = ?1`,
	count: `SELECT count(*) FROM payments`,
}

// openSQLite opens (creates) the SQLite file at path: the store, which
// creates its tables (the records', the outbox's and the state records')
// and checks the file's settings, and the payments table beside them.
// Expired records are purged every minute.
func openSQLite(ctx context.Context, path string, logger *slog.Logger) (*backend, error) {
	s, err := sqlitestore.Open(path,
		sqlitestore.WithPurgeInterval(time.Minute),
		sqlitestore.WithPurgeErrorHandler(func(err error) { logger.Warn("purging expired idempotency records", "error", err) }))
	if err != nil {
		return nil, err // it names the file, and what is wrong with it
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := s.DB().ExecContext(ctx, sqlitePaymentsSchema); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("sqlite file %s: payments table: %w", path, err)
	}
	return &backend{
		store: s,
		name:  "sqlite " + path,
		// The payments' statements outside a transaction only read:
		// OutboxDB runs them beside the writers.
		payments: &paymentsTable{sql: sqlitePayments, db: s.OutboxDB(), tx: sqliteTx},
		states:   s.States(),
		relay:    func(sink outbox.Sink, opts ...relay.Option) *relay.Relay { return s.Relay(sink, opts...) },
		file:     path,
		close: func() {
			if err := s.Close(); err != nil {
				logger.Warn("closing the sqlite store", "file", path, "error", err)
			}
		},
	}, nil
}

// sqliteTx returns the transaction of the request or local run whose
// context ctx is, on a sqlitestore.Store.
func sqliteTx(ctx context.Context) (lifecycle.DB, bool) {
	tx, ok := sqlitestore.TxFromContext(ctx)
	if !ok {
		return nil, false
	}
	return lifecycle.SQL(tx, lifecycle.SQLite), true
}
