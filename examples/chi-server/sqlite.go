package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/sqlitestore"
)

// SQLite mode (-sqlite FILE, or $SQLITE_PATH): the idempotency records and
// the payments live in one SQLite file, the store's table (package
// sqlitestore) beside a payments table, so that the server keeps both
// across a restart with no other server running. Each payment is a row
// inserted in the request's transaction, as in PostgreSQL mode: the row
// and the key's record commit together, or neither does.
//
// SQLite lets one transaction write at a time: a transactional request
// holds the file's write lock while its handler runs (a slow payment's
// ?delay= included), and the payments of other keys wait for it (a
// duplicate of its own key does not: it reads the record, and gets 409 or
// waits). A payment whose transaction cannot begin within a third of the
// lease is answered 503 and its key released. Payments are captured as
// they are made; the scheduled captures and the state records are
// PostgreSQL mode's.

// sqlitePaymentsSchema is the payments table of the SQLite mode: the
// PostgreSQL mode's, without the columns of scheduled captures. As there,
// the client's key is kept for reference, without a unique constraint.
const sqlitePaymentsSchema = `
CREATE TABLE IF NOT EXISTS payments (
	id              INTEGER PRIMARY KEY,
	user_name       TEXT    NOT NULL,
	idempotency_key TEXT    NOT NULL,
	amount          INTEGER NOT NULL CHECK (amount > 0),
	currency        TEXT    NOT NULL,
	created         TEXT    NOT NULL, -- RFC 3339, UTC
	status          TEXT    NOT NULL DEFAULT 'captured'
)`

// openSQLite opens (creates) the SQLite file at path: the store, which
// creates its table and checks the file's settings, and the payments
// table beside it. Expired records are purged every minute.
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
	return &backend{store: s, name: "sqlite " + path, sqlite: s.DB(), file: path, close: func() {
		if err := s.Close(); err != nil {
			logger.Warn("closing the sqlite store", "file", path, "error", err)
		}
	}}, nil
}

// createPaymentSQLite makes a payment in SQLite mode: it inserts the row
// in the request's transaction, which the middleware commits together
// with the key's record once the handler has answered. As in PostgreSQL
// mode the provider is called after the INSERT: when it fails, the 5xx
// rolls the row back.
func (a *api) createPaymentSQLite(w http.ResponseWriter, r *http.Request) {
	p, ok := readPayment(w, r)
	if !ok {
		return
	}
	info, _ := idempotency.FromContext(r.Context())
	tx, ok := sqlitestore.TxFromContext(r.Context())
	if !ok {
		a.serverError(w, r, http.StatusInternalServerError, "no transaction",
			errors.New("the route has no transaction: its middleware needs idempotency.WithTransaction(true) on a sqlitestore.Store"))
		return
	}
	p.Status, p.Created = stateCaptured, time.Now().UTC()
	var id int64
	err := tx.QueryRowContext(r.Context(),
		`INSERT INTO payments (user_name, idempotency_key, amount, currency, created, status)
		VALUES (?, ?, ?, ?, ?, ?) RETURNING id`,
		p.User, info.Key, p.Amount, p.Currency, p.Created.Format(time.RFC3339Nano), p.Status).Scan(&id)
	if err != nil {
		a.serverError(w, r, http.StatusInternalServerError, "payment not recorded", fmt.Errorf("inserting a payment: %w", err))
		return
	}
	if !a.charge(w, r) {
		return
	}
	p.ID = paymentID(id)
	w.Header().Set("Location", "/payments/"+p.ID)
	writeJSON(w, http.StatusCreated, p)
}

// readPaymentSQLite reads the payments row id of the SQLite file db. The
// error wraps sql.ErrNoRows when there is no such row.
func readPaymentSQLite(ctx context.Context, db *sql.DB, id int64) (payment, error) {
	p := payment{ID: paymentID(id)}
	var created string
	err := db.QueryRowContext(ctx, `SELECT user_name, amount, currency, created, status FROM payments WHERE id = ?`, id).
		Scan(&p.User, &p.Amount, &p.Currency, &created, &p.Status)
	if err != nil {
		return payment{}, err
	}
	if p.Created, err = time.Parse(time.RFC3339Nano, created); err != nil {
		return payment{}, fmt.Errorf("payment %s: created %q: %w", p.ID, created, err)
	}
	return p, nil
}
