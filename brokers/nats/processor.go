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

// Action is the acknowledgement Process sent for a message.
type Action int

const (
	// Ack: the message is done (a confirmed ack, sent after the record
	// completed); the server does not redeliver it.
	Ack Action = iota + 1
	// Nak: the server redelivers the message after Outcome.Delay, within
	// the consumer's MaxDeliver.
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
	// Ran reports that the handler ran for this delivery.
	Ran bool
	// Replayed reports that the key's record was complete: the handler
	// ran for an earlier delivery or publication, not for this one.
	Replayed bool
	// Epoch is the attempt that ran the handler for this delivery (1 for
	// the first, +1 for each takeover after a holder died); 0 when it did
	// not run under a lease.
	Epoch uint64
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
// (WithAckWait) until Do returns, and then acks, naks or terms the message
// as the package documentation's table says. It returns what it sent, and
// the error that decided it (or the acknowledgement's own), which also
// went to the error handler unless it is an *idempotency.InFlightError.
//
// ctx is the handler's context (with the call's Info added) and bounds the
// wait for the key's record; the acknowledgement is sent even when ctx
// has ended. When the handler panics, the key is released, the message is
// naked and the panic goes on.
func (p *Processor[T]) Process(ctx context.Context, msg jetstream.Msg) (Outcome, error) {
	return p.process(ctx, msg, p.cfg.ackWait)
}

// Consume handles the messages of cons with Process until ctx ends, one
// at a time, taking the AckWait from the consumer's configuration (its
// shortest BackOff interval when it has one). opts are those of
// jetstream's Consume (jetstream.PullMaxMessages, ...); consumption errors
// go to the error handler unless opts hold a jetstream.ConsumeErrHandler.
// Run Consume on several goroutines, or in several processes, to handle
// messages in parallel.
//
// Messages buffered behind a running handler get no in-progress acks: a
// buffered message whose AckWait passes is redelivered, and then replayed
// or run once. With slow handlers, keep the buffer small
// (jetstream.PullMaxMessages).
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
	ackWait := consumerAckWait(info.Config, p.cfg.ackWait)
	report := jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		p.cfg.onError(ctx, nil, fmt.Errorf("idemnats: consume: %w", err))
	})
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		_, _ = p.process(ctx, msg, ackWait)
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

// call is what Process learned of the handler's run.
type call struct {
	ran   bool   // the handler was called
	epoch uint64 // its lease's epoch
	tx    bool   // it ran in a transaction: its writes commit with the record
	err   error  // its error
}

func (p *Processor[T]) process(ctx context.Context, msg jetstream.Msg, ackWait time.Duration) (Outcome, error) {
	key, err := p.cfg.key(msg)
	if err != nil {
		return p.settle(ctx, msg, ackWait, Outcome{Action: Term}, err)
	}
	c := idempotency.Call{Name: p.name, Key: key, Scope: p.cfg.scope(msg), Payload: p.cfg.payload(msg)}

	stop := keepInProgress(msg, ackWait/3, func(err error) {
		p.cfg.onError(ctx, msg, fmt.Errorf("idemnats: in progress: %w", err))
	})
	var run call
	panicked := true
	defer func() {
		if panicked { // Do released the key; the panic goes on
			stop()
			out := Outcome{Action: Nak, Delay: p.cfg.nakDelay, Ran: run.ran, Epoch: run.epoch}
			p.settle(ctx, msg, ackWait, out, errors.New("the handler panicked"))
		}
	}()
	_, err = idempotency.Do(ctx, p.runner, c, func(ctx context.Context) (T, error) {
		run.ran = true
		if info, ok := idempotency.FromContext(ctx); ok {
			run.epoch, run.tx = info.Epoch, info.Tx != nil
		}
		v, err := p.fn(ctx, msg)
		run.err = err
		return v, err
	})
	panicked = false
	stop()

	out := Outcome{Ran: run.ran, Epoch: run.epoch}
	out.Action, out.Delay, err = p.decide(err, run)
	out.Replayed = out.Action == Ack && !run.ran
	return p.settle(ctx, msg, ackWait, out, err)
}

// decide returns what a message gets once Do returned err after the
// handler's run (see the package documentation's table), and the error to
// report.
func (p *Processor[T]) decide(err error, run call) (Action, time.Duration, error) {
	var inFlight *idempotency.InFlightError
	switch {
	case err == nil:
		return Ack, 0, nil
	case run.err != nil: // the handler failed: Do released the key
		return Nak, p.cfg.nakDelay, err
	case run.ran && run.tx: // nothing was committed, or a retry settles it
		return Nak, p.cfg.nakDelay, err
	case run.ran: // the handler's effects stand, stored or not
		return Ack, 0, err
	case errors.As(err, &inFlight):
		if inFlight.Remaining > 0 {
			return Nak, inFlight.Remaining, err
		}
		return Nak, p.cfg.nakDelay, err
	case errors.Is(err, idempotency.ErrResultOmitted):
		return Ack, 0, nil // the handler ran once; a consumer needs no stored value
	case errors.Is(err, idempotency.ErrFingerprintMismatch),
		errors.Is(err, idempotency.ErrInvalidKey),
		errors.Is(err, idempotency.ErrCorruptRecord):
		return Term, 0, err
	default: // the store failed before the handler ran
		return Nak, p.cfg.nakDelay, err
	}
}

// settle sends out.Action for msg and returns out with the error that
// decided it, or that the acknowledgement met, reporting it.
func (p *Processor[T]) settle(ctx context.Context, msg jetstream.Msg, ackWait time.Duration, out Outcome, cause error) (Outcome, error) {
	var sent error
	switch out.Action {
	case Ack:
		// Confirmed, so that an ack that never reached the server is
		// reported; its redelivery would replay.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackWait/3)
		sent = msg.DoubleAck(actx)
		cancel()
	case Nak:
		if out.Delay > 0 {
			sent = msg.NakWithDelay(out.Delay)
		} else {
			sent = msg.Nak()
		}
	case Term:
		sent = msg.Term()
	}
	var err error
	if cause != nil {
		err = fmt.Errorf("idemnats: %v: %w", out.Action, cause)
	}
	if sent != nil {
		err = errors.Join(err, fmt.Errorf("idemnats: send %v: %w", out.Action, sent))
	}
	var inFlight *idempotency.InFlightError
	if err != nil && (sent != nil || !errors.As(cause, &inFlight)) {
		p.cfg.onError(ctx, msg, err)
	}
	return out, err
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
