// Package calltx finds the transaction of a transactional route or call
// (idempotency.Info.Tx) as the outbox's edges take it, for outbox.Enqueue,
// outbox.Cancel and the local runs (outbox/local), out of users' reach.
package calltx

import (
	"context"
	"errors"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/pgstore"
)

// Errors of Of.
var (
	// ErrNoInfo: the context is not one of a handler or function run by
	// the idempotency middleware or Do.
	ErrNoInfo = errors.New("the context is not one of a handler or function run by the idempotency middleware or Do")
	// ErrNoTx: the route or Runner has no transaction over a store that
	// keeps an outbox.
	ErrNoTx = errors.New("the route or Runner has no idempotency.WithTransaction(true) over a store that keeps an outbox (pgstore, sqlitestore)")
)

// Of returns the Info of the transactional route or call whose context
// ctx is, its transaction as a lifecycle.DB, and its Store's outbox table:
// the handle's own (lifecycle.TxOutbox, as sqlitestore's is), or for a pgx
// transaction (pgstore's) the PostgreSQL table its Store names. The error
// is ErrNoInfo or ErrNoTx, or Table's.
func Of(ctx context.Context) (idempotency.Info, lifecycle.DB, *lifecycle.Table, error) {
	info, ok := idempotency.FromContext(ctx)
	if !ok {
		return info, nil, nil, ErrNoInfo
	}
	if o, ok := info.Tx.(lifecycle.TxOutbox); ok {
		db, table := o.Outbox()
		return info, db, table, nil
	}
	tx, ok := info.Tx.(pgx.Tx)
	if !ok {
		return info, nil, nil, ErrNoTx
	}
	name := pgstore.DefaultOutboxTable
	if o, ok := info.Tx.(interface{ OutboxTable() string }); ok {
		name = o.OutboxTable()
	}
	table, err := Table(name)
	if err != nil {
		return info, nil, nil, err
	}
	return info, lifecycle.Pgx(tx), table, nil
}

// tables are the PostgreSQL outbox tables by name, their statements
// rendered once.
var tables sync.Map // string -> *lifecycle.Table

// Table returns the PostgreSQL outbox table named name, rendered once per
// process (outbox.Table).
func Table(name string) (*lifecycle.Table, error) {
	if t, ok := tables.Load(name); ok {
		return t.(*lifecycle.Table), nil
	}
	t, err := lifecycle.New(name, lifecycle.PostgreSQL)
	if err != nil {
		return nil, err
	}
	got, _ := tables.LoadOrStore(name, t)
	return got.(*lifecycle.Table), nil
}
