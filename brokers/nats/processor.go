package idemnats

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrConsumerStopped is returned by Consume when the consumption ended
// before its context did: the consumer was deleted, or the connection
// closed. The reason went to the error handler (see WithErrorHandler).
var ErrConsumerStopped = errors.New("idemnats: consumption stopped")

// ErrLastDelivery is wrapped, with the reason, by the error of a message
// that Process termed instead of naking it because it was the consumer's
// last delivery of it (MaxDeliver: see WithMaxDeliver): the server would
// not have delivered it again, and nothing will retry it. The error
// handler gets it once per such message: dead-letter the message there.
var ErrLastDelivery = errors.New("idemnats: last delivery")

// Action is the acknowledgement Process sent for a message.
type Action int

const (
	// Ack: the message is done (a confirmed ack, sent after the record
	// completed); the server does not redeliver it.
	Ack Action = iota + 1
	// Nak: the server redelivers the message after Outcome.Delay, within
	// the consumer's MaxDeliver; the redelivery counts toward it.
	Nak
	// Term: the server never redelivers the message.
	Term
)

func (a Action) String() string {
	switch a {
	case Ack:
		return "ack"
	case Nak:
		return "nak"
	case Term:
		return "term"
	}
	return "Action(" + fmt.Sprint(int(a)) + ")"
}

// Outcome is what Process did with a message.
type Outcome struct {
	// Action is the acknowledgement sent.
	Action Action
	// Delay is the delay of a Nak.
	Delay time.Duration
	// Ran reports that the handler ran for this delivery, whether or not
	// its effects stand.
	Ran bool
	// Replayed reports that the key's record was complete: the handler
	// ran for an earlier delivery or publication, not for this one
	// (idempotency.OutcomeReplayed, idempotency.OutcomeReplayedOmitted).
	Replayed bool
	// Epoch is the attempt that ran the handler for this delivery and
	// whose effects stand (1 for the first, +1 for each takeover after a
	// holder died): idempotency.Result.Epoch. It is 0 when the handler did
	// not run, failed, or, in a transaction, committed nothing.
	Epoch uint64
	// Reason is how the handler's call through idempotency.Do ended, which
	// decided Action (see the package documentation's table):
	// idempotency.OutcomeInvalid for a message the key function refused,
	// idempotency.OutcomeReleased for a handler that panicked.
	Reason idempotency.Outcome
	// LastDelivery reports that the message was on the consumer's last
	// delivery (MaxDeliver) and was termed instead of naked: nothing will
	// retry it, and the error Process returns wraps ErrLastDelivery.
	LastDelivery bool
}

// Processor handles JetStream messages with a handler that runs once per
// key (see the package documentation for what each message gets). It is
// safe for concurrent use.
type Processor[T any] struct {
	runner *idempotency.Runner
	name   string
	fn     func(ctx context.Context, msg jetstream.Msg) (T, error)
	cfg    config
}

// NewProcessor returns a Processor running fn once per message key among
// every Processor on r's store with the same name, the operation's name
// (idempotency.Call.Name: part of each record's identity, and the route of
// its events). fn's result is stored as the key's record (r's Codec); on a
// transactional Runner (idempotency.WithTransaction), fn writes through
// the transaction in its context (pgstore.TxFromContext) and its writes
// commit with the record. fn's context holds the call's idempotency.Info
// and is cancelled, with a cause wrapping idempotency.ErrLeaseLost, when
// the lease is lost. NewProcessor panics when r or fn is nil or name is
// empty.
func NewProcessor[T any](r *idempotency.Runner, name string, fn func(ctx context.Context, msg jetstream.Msg) (T, error), opts ...Option) *Processor[T] {
	switch {
	case r == nil:
		panic("idemnats: NewProcessor needs a Runner")
	case name == "":
		panic("idemnats: NewProcessor needs an operation name")
	case fn == nil:
		panic("idemnats: NewProcessor needs a handler")
	}
	return &Processor[T]{runner: r, name: name, fn: fn, cfg: newConfig(opts)}
}

// Process handles one message: it runs the handler under the message's key
// with idempotency.Do, sending in-progress acks every third of the AckWait
// (WithAckWait) until it is done, and then acks, naks or terms the message
// as the package documentation's table says, by the outcome of Do. It
// returns what it sent, and the error that decided it (or the
// acknowledgement's own), which also went to the error handler unless it
// is that of a message naked while another call held its key.
//
// While another call holds the key, Process keeps the message and waits
// for it (idempotency.WaitForHolder: woken by the store when the holder
// ends, and checking again when its lease may have run out) until the
// key's record is complete (a replay), released (the handler runs) or
// abandoned (the handler runs, at the next epoch), or ctx ends; only then
// is the message naked, and that redelivery counts toward MaxDeliver.
//
// A nak's delay is a backoff by the message's delivery count (WithNakDelay,
// WithMaxNakDelay). On the consumer's last delivery (WithMaxDeliver) a
// message that would be naked is termed instead, with an error wrapping
// ErrLastDelivery.
//
// ctx is the handler's context (with the call's Info added) and bounds the
// wait for the key's record; the acknowledgement is sent even when ctx
// has ended. When the handler panics, the key is released, the message is
// naked (termed on its last delivery) and the panic goes on.
func (p *Processor[T]) Process(ctx context.Context, msg jetstream.Msg) (Outcome, error) {
	return p.process(ctx, msg, consumerLimits{ackWait: p.cfg.ackWait, maxDeliver: p.cfg.maxDeliver})
}

// Consume handles the messages of cons with Process until ctx ends, one
// at a time, taking the AckWait from the consumer's configuration (its
// shortest BackOff interval when it has one), and its MaxDeliver. opts
// are those of jetstream's Consume (jetstream.PullMaxMessages, ...);
// consumption errors go to the error handler unless opts hold a
// jetstream.ConsumeErrHandler. Run Consume on several goroutines, or in
// several processes, to handle messages in parallel.
//
// Messages buffered behind a running handler, or behind a message waiting
// for another holder of its key, get no in-progress acks: a buffered
// message whose AckWait passes is redelivered, which counts toward
// MaxDeliver, and then replayed or run once. Keep the buffer small
// (jetstream.PullMaxMessages) when handlers are slow or keys are often
// held.
//
// When ctx ends, Consume stops taking messages, the running handler's
// context is cancelled, and Consume returns nil once the handler returned
// and its message was acknowledged. It returns ErrConsumerStopped when
// the consumption ended first. A handler's panic goes on after its
// message was naked, and ends the program as on any goroutine.
func (p *Processor[T]) Consume(ctx context.Context, cons jetstream.Consumer, opts ...jetstream.PullConsumeOpt) error {
	if cons == nil {
		panic("idemnats: Consume needs a Consumer")
	}
	info := cons.CachedInfo()
	if info == nil {
		var err error
		if info, err = cons.Info(ctx); err != nil {
			return fmt.Errorf("idemnats: consumer info: %w", err)
		}
	}
	lim := consumerLimits{ackWait: consumerAckWait(info.Config, p.cfg.ackWait), maxDeliver: info.Config.MaxDeliver}
	report := jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		p.cfg.onError(ctx, nil, fmt.Errorf("idemnats: consume: %w", err))
	})
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		_, _ = p.process(ctx, msg, lim)
	}, append([]jetstream.PullConsumeOpt{report}, opts...)...)
	if err != nil {
		return fmt.Errorf("idemnats: consume: %w", err)
	}
	select {
	case <-ctx.Done():
		cc.Stop()
		<-cc.Closed() // after the running handler returned
		return nil
	case <-cc.Closed():
		return ErrConsumerStopped
	}
}

// consumerAckWait returns the shortest time the consumer configured by cfg
// waits for an ack: its AckWait, or the shortest of its BackOff intervals;
// def when the configuration says neither.
func consumerAckWait(cfg jetstream.ConsumerConfig, def time.Duration) time.Duration {
	d := cfg.AckWait
	for _, b := range cfg.BackOff {
		if b > 0 && (d <= 0 || b < d) {
			d = b
		}
	}
	if d <= 0 {
		return def
	}
	return d
}

// consumerLimits is what Process knows of the consumer of a message.
type consumerLimits struct {
	ackWait    time.Duration // its AckWait
	maxDeliver int           // its MaxDeliver; below 1: unlimited
}

func (p *Processor[T]) process(ctx context.Context, msg jetstream.Msg, lim consumerLimits) (Outcome, error) {
	key, err := p.cfg.key(msg)
	if err != nil {
		p.runner.Reject(ctx, p.name, err)
		return p.settle(ctx, msg, lim, Outcome{Reason: idempotency.OutcomeInvalid}, 0, err)
	}
	// A duplicate waits for the holder of its key, keeping its message,
	// rather than spend a delivery the holder may need.
	c := idempotency.Call{Name: p.name, Key: key, Scope: p.cfg.scope(msg), Payload: p.cfg.payload(msg),
		Wait: idempotency.WaitForHolder}

	stop := keepInProgress(msg, lim.ackWait/3, func(err error) {
		p.cfg.onError(ctx, msg, fmt.Errorf("idemnats: in progress: %w", err))
	})
	panicked := true
	defer func() {
		if panicked { // Do released the key; the panic goes on
			stop()
			out := Outcome{Reason: idempotency.OutcomeReleased, Ran: true}
			p.settle(ctx, msg, lim, out, 0, errors.New("the handler panicked"))
		}
	}()
	res, err := idempotency.Do(ctx, p.runner, c, func(ctx context.Context) (T, error) { return p.fn(ctx, msg) })
	panicked = false
	stop()

	out := Outcome{
		Reason:   res.Outcome,
		Ran:      res.Outcome.Ran(),
		Replayed: res.Outcome == idempotency.OutcomeReplayed || res.Outcome == idempotency.OutcomeReplayedOmitted,
		Epoch:    res.Epoch,
	}
	return p.settle(ctx, msg, lim, out, res.RetryAfter, err)
}

// keepInProgress sends msg an in-progress ack every interval until the
// returned function is called, which returns once none is being sent.
// Errors go to fail.
func keepInProgress(msg jetstream.Msg, every time.Duration, fail func(error)) (stop func()) {
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if err := msg.InProgress(); err != nil {
					fail(err)
				}
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
	}
}
