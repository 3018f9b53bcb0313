package main

import (
	"context"
	"errors"

	"github.com/go-idempotency/idempotency/outbox/lifecycle"
)

// paymentsTable is the payments table of the PostgreSQL and SQLite modes:
// its few statements in the engine's SQL (postgresPayments in store.go,
// sqlitePayments in sqlite.go), run through the engine-neutral handle of
// the outbox's edges (lifecycle.DB), which also reads the engine's times.
// The handlers, the scheduled captures and the state records are the same
// in both modes; only this table, the state store and the relay differ
// (see backend).
type paymentsTable struct {
	sql paymentsSQL
	// db is the database, for the statements outside a transaction.
	db lifecycle.DB
	// tx returns the transaction of the request or local run whose
	// context ctx is, false when it has none.
	tx func(ctx context.Context) (lifecycle.DB, bool)
}

// paymentsSQL are the statements of the payments table in one engine's
// SQL. Each payment's columns are read in the order of payment's fields:
// user_name, amount, currency, created, status, capture_at.
type paymentsSQL struct {
	// insert adds a payment: $1 user, $2 idempotency key, $3 amount, $4
	// currency, $5 status, $6 capture time (NULL: now, captured as it is
	// made). It returns id, created and capture_at.
	insert string
	// schedule keeps $2, the ID of the capture message, with the payment
	// $1.
	schedule string
	// settle sets the payment $1 to the status $2: captured now, or
	// canceled with no capture time. It returns the payment's columns and
	// capture_id.
	settle string
	// read returns the payment $1's columns.
	read string
	// count counts the payments.
	count string
}

// errNoTransaction is the error of a write outside the transaction of a
// request or a local run: the routes that write have one
// (idempotency.WithTransaction(true)), and a local run always has one.
var errNoTransaction = errors.New("no transaction in the context: the route needs idempotency.WithTransaction(true) on a pgstore.Store or a sqlitestore.Store")

// on returns ctx's transaction, or the database when ctx has none.
func (t *paymentsTable) on(ctx context.Context) lifecycle.DB {
	if tx, ok := t.tx(ctx); ok {
		return tx
	}
	return t.db
}

// in returns ctx's transaction, for a write that commits with it.
func (t *paymentsTable) in(ctx context.Context) (lifecycle.DB, error) {
	if tx, ok := t.tx(ctx); ok {
		return tx, nil
	}
	return nil, errNoTransaction
}

// insert adds the payment p (its user, amount, currency, status and, when
// it is authorized, the time of its capture), made with the idempotency
// key, in ctx's transaction: the row commits with the key's record, or
// not at all. It returns p with its ID, and its Created and CaptureAt as
// stored.
func (t *paymentsTable) insert(ctx context.Context, p payment, key string) (payment, int64, error) {
	tx, err := t.in(ctx)
	if err != nil {
		return payment{}, 0, err
	}
	var id int64
	err = lifecycle.QueryRow(ctx, tx, t.sql.insert, []any{p.User, key, p.Amount, p.Currency, p.Status, p.CaptureAt},
		&id, &p.Created, &p.CaptureAt)
	if err != nil {
		return payment{}, 0, err
	}
	p.ID = paymentID(id)
	return p.utc(), id, nil
}

// schedule keeps captureID, the ID of the payment id's capture message,
// with its row, in ctx's transaction, for its cancel.
func (t *paymentsTable) schedule(ctx context.Context, id int64, captureID string) error {
	tx, err := t.in(ctx)
	if err != nil {
		return err
	}
	return tx.Exec(ctx, t.sql.schedule, id, captureID)
}

// settle sets the payment id to status (captured: now; canceled: no
// capture time) in ctx's transaction, and returns it, with the ID of its
// capture message ("" for none). The error wraps lifecycle.ErrNoRows
// when there is no such payment.
func (t *paymentsTable) settle(ctx context.Context, id int64, status string) (payment, string, error) {
	tx, err := t.in(ctx)
	if err != nil {
		return payment{}, "", err
	}
	p := payment{ID: paymentID(id)}
	var captureID *string
	err = lifecycle.QueryRow(ctx, tx, t.sql.settle, []any{id, status},
		&p.User, &p.Amount, &p.Currency, &p.Created, &p.Status, &p.CaptureAt, &captureID)
	switch {
	case err != nil:
		return payment{}, "", err
	case captureID == nil:
		return p.utc(), "", nil
	}
	return p.utc(), *captureID, nil
}

// read returns the payment id: in ctx's transaction when it has one (a
// local run's), else on the database. The error wraps lifecycle.ErrNoRows
// when there is no such payment.
func (t *paymentsTable) read(ctx context.Context, id int64) (payment, error) {
	p := payment{ID: paymentID(id)}
	err := lifecycle.QueryRow(ctx, t.on(ctx), t.sql.read, []any{id},
		&p.User, &p.Amount, &p.Currency, &p.Created, &p.Status, &p.CaptureAt)
	return p.utc(), err
}

// count returns how many payments the table holds: those committed.
func (t *paymentsTable) count(ctx context.Context) (int64, error) {
	var n int64
	err := lifecycle.QueryRow(ctx, t.db, t.sql.count, nil, &n)
	return n, err
}

// utc returns p with its times in UTC, as the API answers them.
func (p payment) utc() payment {
	p.Created, p.CaptureAt = p.Created.UTC(), utc(p.CaptureAt)
	return p
}
