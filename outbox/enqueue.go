package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/outbox/internal/calltx"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
)

// Errors of Enqueue and Cancel.
var (
	// ErrNoTransaction is wrapped by the error of Enqueue or Cancel called
	// outside a transactional route or call: a context without the
	// idempotency middleware's or Do's Info, or with one whose route or
	// Runner has no idempotency.WithTransaction(true) over a store that
	// keeps an outbox (a pgstore.Store, a sqlitestore.Store).
	ErrNoTransaction = errors.New("outbox: no transaction")
	// ErrInvalidMessage is wrapped by the error of Enqueue given a message
	// that breaks the grammar written beside Message (see
	// Message.Validate). Nothing was enqueued.
	ErrInvalidMessage = errors.New("outbox: invalid message")
)

// Enqueue adds msgs to the outbox in the transaction of the transactional
// route or call whose context ctx is (idempotency.WithTransaction(true) on
// a pgstore.Store or a sqlitestore.Store): they commit with its record and
// its other writes, or not at all. A 5xx, a panic, a lost lease or a
// failed commit leaves none of them. It returns their IDs, in the order of
// msgs.
//
// Each message's ID is derived from the record: "<storage key>/<sequence
// within the record, from 1>" (see ID), stable across attempts (a stolen
// attempt's rolled-back messages and the thief's get the same IDs) and
// unique, for downstream deduplication. A handler that calls Enqueue more
// than once continues the sequence. A key used again after its record
// expired continues it too, past the messages of the earlier record still
// in the table (the relay's retention keeps them).
//
// A message is ready at once, or scheduled when its NotBefore is later
// than the database's clock. The table is the outbox of the Store that
// began the transaction (pgstore.WithOutboxTable, pgstore.DefaultOutboxTable
// by default), and the statement notifies the relays listening on it when
// the transaction commits. Enqueue is one round trip; with messages that
// set OrderingKey it first takes a transaction-level advisory lock on each
// of those keys (in the same round trip), so that the transactions
// enqueueing on one key commit in the order their messages are numbered:
// another transaction enqueueing on the same key waits for this one to
// end. Take keys in one order across handlers, or the server breaks the
// deadlock by failing one of them.
//
// Outside a transactional route the error wraps ErrNoTransaction. Every
// message is checked against its grammar (Message.Validate) before
// anything is written: a message that breaks it fails the call with an
// error wrapping ErrInvalidMessage that names the message's index and the
// rule. When another attempt at the same record committed its messages
// first (it took the record over and completed it), the error wraps
// idempotency.ErrLeaseLost: this attempt cannot commit either. Any other
// error is the database's; after it the transaction is aborted, so answer
// with a status that rolls it back (a 5xx) or return the error from Do's
// function.
func Enqueue(ctx context.Context, msgs ...Message) ([]string, error) {
	info, tx, table, err := transaction(ctx)
	if err != nil {
		return nil, err
	}
	if len(msgs) == 0 {
		return nil, nil
	}
	rows := make([]lifecycle.NewMessage, len(msgs))
	for i, m := range msgs {
		if err := m.Validate(); err != nil {
			return nil, fmt.Errorf("outbox: message %d: %w", i, err)
		}
		rows[i] = lifecycle.NewMessage{Topic: m.Topic, Payload: m.Payload, Headers: m.Headers, OrderingKey: m.OrderingKey, NotBefore: m.NotBefore}
	}
	ids, err := table.Enqueue(ctx, tx, info.StorageKey, rows)
	if errors.Is(err, lifecycle.ErrConflict) {
		return nil, fmt.Errorf("outbox: enqueue: another attempt at the record committed its messages first: %w", idempotency.ErrLeaseLost)
	}
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	return ids, nil
}

// transaction returns the Info of the transactional route or call whose
// context ctx is, its transaction, and its Store's outbox table.
func transaction(ctx context.Context) (idempotency.Info, lifecycle.DB, *lifecycle.Table, error) {
	info, db, table, err := calltx.Of(ctx)
	switch {
	case errors.Is(err, calltx.ErrNoInfo), errors.Is(err, calltx.ErrNoTx):
		return info, nil, nil, fmt.Errorf("%w: %w", ErrNoTransaction, err)
	case err != nil:
		return info, nil, nil, fmt.Errorf("outbox: %w", err)
	}
	return info, db, table, nil
}

// Table returns the outbox table named name (as pgstore.WithOutboxTable
// takes it) in PostgreSQL, the statements of its edges rendered once per
// process: what Enqueue and Cancel write to, for a relay or a tool to
// share. It returns an error for a name pgstore would refuse.
func Table(name string) (*lifecycle.Table, error) {
	t, err := calltx.Table(name)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	return t, nil
}

// Channel returns the LISTEN/NOTIFY channel on which the transactions that
// enqueue into the outbox table named table (without its schema) notify
// the relays: the table's name itself. Outboxes of the same name in two
// schemas share it, which costs their relays a wasted wake-up, no more.
func Channel(table string) string { return table }
