package idemrabbit

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/go-idempotency/idempotency"
)

// Errors of Process.
var (
	// ErrNoMessageID is returned by Process for a delivery without a
	// message_id; the delivery is rejected.
	ErrNoMessageID = errors.New("idemrabbit: delivery has no message_id")
	// ErrLastDelivery is wrapped, with the reason, by the error of a
	// delivery that would have been requeued but was the last the queue
	// makes (WithDeliveryLimit): Process rejected it instead, and the queue
	// dead-letters it (or drops it, without a dead-letter exchange).
	ErrLastDelivery = errors.New("idemrabbit: last delivery")
	// errPanicked is the reason reported for a handler that panicked.
	errPanicked = errors.New("the handler panicked")
)

// Action is what Process sent the broker for a delivery.
type Action int

const (
	// Ack: the delivery is done; the broker drops the message.
	Ack Action = iota + 1
	// Requeue: rejected with requeue; the broker delivers the message
	// again, and a quorum queue counts the delivery toward its limit.
	Requeue
	// Reject: rejected without requeue; the broker drops the message, or
	// dead-letters it when the queue has a dead-letter exchange.
	Reject
)

func (a Action) String() string {
	switch a {
	case Ack:
		return "ack"
	case Requeue:
		return "requeue"
	case Reject:
		return "reject"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// Settlement is how Process settled a delivery.
type Settlement struct {
	// Action is what the broker was sent.
	Action Action
	// Delivery counts the deliveries of the message, this one included:
	// 1 for the first, x-delivery-count+1 on a quorum queue's
	// redeliveries. A classic queue says only whether the message was
	// delivered before: 2 stands for any redelivery there.
	Delivery int
	// Delay is, for a requeue after a failure, the backoff Process chose
	// and held the delivery for before requeueing it (less when ctx
	// ended first).
	Delay time.Duration
	// Final reports that the delivery would have been requeued but was
	// the last the queue makes (WithDeliveryLimit): it was rejected
	// instead, and the error wraps ErrLastDelivery.
	Final bool
}

// Call returns the idempotency.Call of d for the operation name: its key
// is d's message_id (the outbox message's ID), its payload d's body.
func Call(name string, d amqp.Delivery) idempotency.Call {
	return idempotency.Call{Name: name, Key: d.MessageId, Payload: d.Body}
}

// Processor handles RabbitMQ deliveries with a handler that runs once per
// message_id (see the package documentation for what each delivery gets).
// It is safe for concurrent use.
type Processor[T any] struct {
	runner *idempotency.Runner
	name   string
	fn     func(ctx context.Context, d amqp.Delivery) (T, error)
	cfg    processorConfig
}

// NewProcessor returns a Processor running fn once per message_id among
// every Processor on r's store with the same name, the operation's name
// (idempotency.Call.Name: part of each record's identity, and the route
// of its events). fn's result is stored as the key's record (r's Codec);
// on a transactional Runner (idempotency.WithTransaction, pgstore) fn
// writes through pgstore.TxFromContext(ctx), and its writes commit with
// the record. NewProcessor panics when r or fn is nil or name is empty.
func NewProcessor[T any](r *idempotency.Runner, name string, fn func(ctx context.Context, d amqp.Delivery) (T, error), opts ...ProcessorOption) *Processor[T] {
	switch {
	case r == nil:
		panic("idemrabbit: NewProcessor needs a Runner")
	case name == "":
		panic("idemrabbit: NewProcessor needs an operation name")
	case fn == nil:
		panic("idemrabbit: NewProcessor needs a handler")
	}
	return &Processor[T]{runner: r, name: name, fn: fn, cfg: newProcessorConfig(opts)}
}

// Process runs the handler for d (which must come from a consumer with
// manual acks) under d's message_id with idempotency.Do, and settles d as
// the outcome says (see the package documentation's table):
//
//   - done (the handler ran, or ran for an earlier delivery): ack;
//   - another call holds the key: d stays unacked while Do waits for the
//     holder (idempotency.WaitForHolder: woken by the store when the
//     holder ends, checking again when its lease may have run out), until
//     it replays, takes the key over or runs, or ctx ends (d is then
//     requeued at once);
//   - the handler failed, or the store could not be used: d is held for
//     the backoff (WithBackoff), then requeued; or, when d is the last
//     delivery the queue makes (WithDeliveryLimit), rejected at once and
//     reported with ErrLastDelivery;
//   - the call can never succeed (no message_id, the key used with another
//     body, an unreadable record): rejected.
//
// Process returns Do's result, the settlement, and the error that decided
// it joined with the broker's own, which also went to the error handler
// (WithErrorHandler). ctx is the handler's context and bounds the waits;
// d is settled even when ctx has ended. When the handler panics, Do
// releases the key, d is requeued after the backoff, and the panic goes
// on.
func (p *Processor[T]) Process(ctx context.Context, d amqp.Delivery) (idempotency.Result[T], Settlement, error) {
	s := Settlement{Delivery: deliveryNumber(d)}
	if d.MessageId == "" {
		p.runner.Reject(ctx, p.name, ErrNoMessageID)
		return p.settle(ctx, d, idempotency.Result[T]{Outcome: idempotency.OutcomeInvalid}, s, ErrNoMessageID)
	}
	// A duplicate waits for the holder of its key, keeping its delivery,
	// rather than spend one of the queue's deliveries on a message another
	// call is handling.
	call := Call(p.name, d)
	call.Wait = idempotency.WaitForHolder
	settled := false
	defer func() {
		if !settled { // Do released the key and re-raised the panic, which goes on
			p.settle(ctx, d, idempotency.Result[T]{Outcome: idempotency.OutcomeReleased}, s, errPanicked)
		}
	}()
	res, err := idempotency.Do(ctx, p.runner, call, func(ctx context.Context) (T, error) { return p.fn(ctx, d) })
	settled = true
	return p.settle(ctx, d, res, s, err)
}

// settle sends d the settlement the table gives res.Outcome, and returns
// res with it and the error that decided it, reporting that error.
func (p *Processor[T]) settle(ctx context.Context, d amqp.Delivery, res idempotency.Result[T], s Settlement, cause error) (idempotency.Result[T], Settlement, error) {
	rule := settlementOf(res.Outcome)
	if rule.quiet {
		cause = nil
	}
	switch rule.action {
	case ack:
		s.Action = Ack
	case reject:
		s.Action = Reject
	case retry, wait:
		if p.cfg.last(s.Delivery) {
			// Requeued, the queue would drop it or dead-letter it without
			// saying so: reject it, and say so.
			s.Action, s.Final = Reject, true
			cause = lastDelivery(s.Delivery, p.cfg.limit, res.Outcome, cause)
			break
		}
		s.Action = Requeue
		if rule.action == retry { // a wait that ended (ctx did) gives d back at once
			s.Delay = p.cfg.backoff(s.Delivery, res.RetryAfter)
			hold(ctx, s.Delay)
		}
	}
	if cause != nil && !s.Final { // a final error says what was done
		cause = fmt.Errorf("idemrabbit: %v: %w", s.Action, cause)
	}
	err := errors.Join(cause, send(d, s.Action))
	if err != nil {
		p.cfg.onError(ctx, d, err)
	}
	return res, s, err
}

// lastDelivery returns the error of the last delivery (the n-th, under
// x-delivery-limit limit) of a message whose outcome o, with cause, would
// have requeued it.
func lastDelivery(n, limit int, o idempotency.Outcome, cause error) error {
	if cause == nil {
		cause = errors.New(o.String())
	}
	return fmt.Errorf("%w (delivery %d, x-delivery-limit %d), rejected: %v: %w", ErrLastDelivery, n, limit, o, cause)
}

// send sends a for d and returns what sending met.
func send(d amqp.Delivery, a Action) error {
	var err error
	switch a {
	case Ack:
		err = d.Ack(false)
	case Requeue:
		// basic.reject rather than basic.nack: the same requeue for one
		// delivery, and the plain signal of a failed one, which quorum
		// queues count toward their delivery limit.
		err = d.Reject(true)
	case Reject:
		err = d.Reject(false)
	}
	if err != nil {
		return fmt.Errorf("idemrabbit: send %v: %w", a, err)
	}
	return nil
}

// hold waits for d, or until ctx ends, and reports whether d passed.
func hold(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
