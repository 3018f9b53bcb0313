package idemrabbit

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/go-idempotency/idempotency"
)

// ErrNoMessageID is returned by Process for a delivery without a
// message_id; the delivery is rejected.
var ErrNoMessageID = errors.New("idemrabbit: delivery has no message_id")

// Settlement is how Process settled a delivery.
type Settlement int

const (
	// Acked: the delivery is done; the broker drops it.
	Acked Settlement = iota + 1
	// Requeued: nacked with requeue; the broker delivers it again.
	Requeued
	// Rejected: rejected without requeue; the broker drops it, or
	// dead-letters it when the queue has a dead-letter exchange.
	Rejected
)

func (s Settlement) String() string {
	switch s {
	case Acked:
		return "acked"
	case Requeued:
		return "requeued"
	case Rejected:
		return "rejected"
	}
	return fmt.Sprintf("Settlement(%d)", int(s))
}

// Call returns the idempotency.Call of d for the operation name: its key
// is d's message_id (the outbox message's ID), its payload d's body.
func Call(name string, d amqp.Delivery) idempotency.Call {
	return idempotency.Call{Name: name, Key: d.MessageId, Payload: d.Body}
}

// Process runs fn once per message_id among the calls of the operation
// name on r's store, through idempotency.Do, and then settles d (which
// must come from a consumer with manual acks):
//
//	what Do did                                              d is
//	-------------------------------------------------------  --------
//	fn ran and its result is stored, or a replay             Acked
//	fn returned an error or panicked (the key is released)   Requeued
//	transactional Runner: fn ran, nothing was committed      Requeued
//	not transactional: fn ran, its record was not stored     Acked
//	another consumer holds the key (*InFlightError)          Requeued
//	the store failed before fn ran, or ctx ended first       Requeued
//	no message_id; the key used with another payload; an     Rejected
//	unreadable record
//
// RabbitMQ redelivers a requeued message at once: give r WithWait, so
// that a duplicate waits for the holder of its key rather than coming
// back again and again. Process returns Do's result, how d was settled
// and the error that decided it, joined with the settlement's own. On a
// transactional Runner (idempotency.WithTransaction, pgstore) fn writes
// through pgstore.TxFromContext(ctx), and its writes commit with the
// record: once per message ID, whatever dies or is redelivered.
func Process[T any](ctx context.Context, r *idempotency.Runner, name string, d amqp.Delivery, fn func(ctx context.Context, d amqp.Delivery) (T, error)) (idempotency.Result[T], Settlement, error) {
	if d.MessageId == "" {
		return idempotency.Result[T]{}, Rejected, settle(d, Rejected, ErrNoMessageID)
	}
	var ran, tx, failed bool
	panicked := true
	defer func() {
		if panicked { // Do released the key; the panic goes on
			_ = d.Nack(false, true)
		}
	}()
	res, err := idempotency.Do(ctx, r, Call(name, d), func(ctx context.Context) (T, error) {
		ran = true
		if info, ok := idempotency.FromContext(ctx); ok {
			tx = info.Tx != nil
		}
		v, err := fn(ctx, d)
		failed = err != nil
		return v, err
	})
	panicked = false
	var s Settlement
	switch {
	case err == nil, errors.Is(err, idempotency.ErrResultOmitted):
		s, err = Acked, nil
	case failed, ran && tx:
		s = Requeued
	case ran: // its effects stand, stored or not
		s = Acked
	case errors.Is(err, idempotency.ErrFingerprintMismatch),
		errors.Is(err, idempotency.ErrInvalidKey),
		errors.Is(err, idempotency.ErrCorruptRecord):
		s = Rejected
	default:
		s = Requeued
	}
	return res, s, settle(d, s, err)
}

// settle sends s for d and returns cause joined with what sending met.
func settle(d amqp.Delivery, s Settlement, cause error) error {
	var sent error
	switch s {
	case Acked:
		sent = d.Ack(false)
	case Requeued:
		sent = d.Nack(false, true)
	case Rejected:
		sent = d.Reject(false)
	}
	if sent != nil {
		sent = fmt.Errorf("idemrabbit: %v: %w", s, sent)
	}
	if cause != nil {
		cause = fmt.Errorf("idemrabbit: %v: %w", s, cause)
	}
	return errors.Join(cause, sent)
}
