package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/outbox/local"
	"github.com/go-idempotency/idempotency/outbox/relay"
	"github.com/go-idempotency/idempotency/state"
)

// Delayed captures, in PostgreSQL and SQLite modes: a payment is
// authorized, and its capture is an outbox message scheduled for later
// (NotBefore), enqueued in the payment's transaction. The server's own
// relay runs it when it falls due, as a local run (outbox/local): the
// capture's transition of the payment's state record (states.go), its
// UPDATE and the message's done mark commit in one transaction, once.
// Until then POST /payments/{id}/capture captures the payment now and
// POST /payments/{id}/cancel cancels it, each also canceling the message
// (outbox.Cancel) in its transaction.
//
// A relay serves every message of its outbox table, whatever its topic:
// with NATS_URL in PostgreSQL mode the outbox is natsrelay's, and
// payments are captured as they are made instead. The state records'
// events share the table too: a transactional route writes them, as its
// other messages, to its store's outbox.

// topicCapture is the topic of a payment's scheduled capture; its payload
// is the payment's row id.
const topicCapture = "payments.capture"

// scheduleCapture enqueues the capture of the payment id, due at at, in
// the request's transaction, and keeps the message's ID with the payment
// in payments, for its cancel.
func scheduleCapture(ctx context.Context, payments *paymentsTable, id int64, at time.Time) error {
	ids, err := outbox.Enqueue(ctx, outbox.Message{
		Topic:     topicCapture,
		Payload:   []byte(strconv.FormatInt(id, 10)),
		NotBefore: at,
	})
	if err != nil {
		return err
	}
	return payments.schedule(ctx, id, ids[0])
}

// capture returns the work of a payments.capture message: it moves the
// payment's state record from authorized to captured and captures the
// payment's row, in the local run's transaction, which then marks the
// message done and commits them all. A real capture would call the
// payment provider here, with the message's ID
// (idempotency.FromContext(ctx).Key) as its idempotency key, so that a
// retry is one there too.
//
// A payment that is no longer authorized (canceled, or captured by its
// route) is left as it is, and the run succeeds: the conflict says that
// the capture is not to happen, which no retry changes, and the message
// is done. (A route that settled the payment also canceled the message:
// a run that raced it finds its done mark refused, and commits nothing.)
// The transition locks the record before the row is written, as the
// routes do.
func capture(payments *paymentsTable, states *state.Store, logger *slog.Logger) local.Func {
	return func(ctx context.Context, e outbox.Envelope) error {
		id, err := strconv.ParseInt(string(e.Payload), 10, 64)
		if err != nil {
			return outbox.Permanent(fmt.Errorf("capture %s: the payload %q is not a payment's id", e.ID, e.Payload))
		}
		p, err := payments.read(ctx, id) // in the local run's transaction
		if errors.Is(err, lifecycle.ErrNoRows) {
			return outbox.Permanent(fmt.Errorf("capture %s: no payment %s", e.ID, paymentID(id)))
		}
		if err != nil {
			return err
		}
		ref := paymentRef(p.User, p.ID)
		rec, err := states.Get(ctx, ref) // no record is refused for good: the error wraps ErrPermanent
		if err != nil {
			return err
		}
		_, err = states.Transition(ctx, ref, state.Change{From: stateAuthorized, To: stateCaptured, ExpectedVersion: rec.Version})
		if conflict := (*state.ConflictError)(nil); errors.As(err, &conflict) {
			logger.InfoContext(ctx, "capture: the payment is no longer authorized; nothing to do",
				"message", e.ID, "payment", ref.ID, "state", conflict.Current.State, "version", conflict.Current.Version)
			return nil
		}
		if err != nil {
			return err
		}
		_, _, err = payments.settle(ctx, id, stateCaptured)
		return err
	}
}

// newCaptureRelay returns the relay of the outbox of b's database (a
// PostgreSQL database or a SQLite file), the server's only one: it runs
// the captures scheduled there, a local run of capture on a transactional
// Runner over b's store; and it logs the payments' state events, standing
// for their subscribers (this mode has no broker), a payment's in version
// order. opts adds to the relay's options.
func newCaptureRelay(b *backend, logger *slog.Logger, opts ...relay.Option) *relay.Relay {
	runner := idempotency.NewRunner(b.store, idempotency.WithTransaction(true), idempotency.WithLogger(logger))
	captures := local.Sink(runner, capture(b.payments, b.states, logger))
	events := b.states.Topic(machinePayment)
	sink := outbox.SinkFunc(func(ctx context.Context, e outbox.Envelope) error {
		switch e.Topic {
		case topicCapture:
			return captures.Publish(ctx, e) // its error as it is: the relay reads a run's outcome from it
		case events:
			logger.InfoContext(ctx, "payment state event", "id", e.ID, "record", e.OrderingKey, "event", string(e.Payload))
			return nil
		}
		return outbox.Permanent(fmt.Errorf("message %s: no work for its topic %q", e.ID, e.Topic))
	})
	opts = append([]relay.Option{relay.WithName("chi-server"), relay.WithLogger(logger)}, opts...)
	return b.relay(sink, opts...)
}
