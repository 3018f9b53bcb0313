package idemnats

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/nats-io/nats.go/jetstream"
)

// settle sends msg what out.Reason calls for (see settlements), fills in
// out's Action, Delay and LastDelivery, and returns out with the error
// that decided it, or that the acknowledgement met, reporting it.
// retryAfter is Do's Result.RetryAfter.
func (p *Processor[T]) settle(ctx context.Context, msg jetstream.Msg, lim consumerLimits, out Outcome, retryAfter time.Duration, cause error) (Outcome, error) {
	delivered, last := delivery(msg, lim.maxDeliver)
	switch settlementOf(out.Reason) {
	case ack:
		out.Action = Ack
	case ackQuiet:
		out.Action, cause = Ack, nil
	case nak, nakQuiet:
		if last {
			out.Action, out.LastDelivery = Term, true
			break
		}
		out.Action = Nak
		out.Delay = max(backoff(delivered, p.cfg.nakDelay, p.cfg.maxNakDelay), retryAfter)
	case term:
		out.Action = Term
	}

	var sent error
	switch out.Action {
	case Ack:
		// Confirmed, so that an ack that never reached the server is
		// reported; its redelivery would replay.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lim.ackWait/3)
		sent = msg.DoubleAck(actx)
		cancel()
	case Nak:
		sent = msg.NakWithDelay(out.Delay)
	case Term:
		sent = p.term(msg, out)
	}

	var err error
	switch {
	case out.LastDelivery:
		err = &lastDeliveryError{delivered: delivered, maxDeliver: lim.maxDeliver, reason: out.Reason, cause: cause}
	case cause != nil:
		err = fmt.Errorf("idemnats: %v: %w", out.Action, cause)
	}
	if sent != nil {
		err = errors.Join(err, fmt.Errorf("idemnats: send %v: %w", out.Action, sent))
	}
	// A message naked because the consumer stopped is no failure: it
	// comes back, to be replayed or run.
	quiet := settlementOf(out.Reason) == nakQuiet && !out.LastDelivery && sent == nil
	if err != nil && !quiet {
		p.cfg.onError(ctx, msg, err)
	}
	return out, err
}

// lastDeliveryError is the error of a message termed instead of naked on
// its last delivery: it wraps ErrLastDelivery and the cause.
type lastDeliveryError struct {
	delivered  uint64
	maxDeliver int
	reason     idempotency.Outcome
	cause      error // nil when Do returned none
}

func (e *lastDeliveryError) Error() string {
	msg := fmt.Sprintf("idemnats: term: last delivery (%d of %d): %v", e.delivered, e.maxDeliver, e.reason)
	if e.cause != nil {
		msg += ": " + e.cause.Error()
	}
	return msg
}

func (e *lastDeliveryError) Unwrap() []error {
	if e.cause == nil {
		return []error{ErrLastDelivery}
	}
	return []error{ErrLastDelivery, e.cause}
}

// delivery returns the delivery count of msg, and whether it is the last
// delivery that a consumer with maxDeliver makes. A message without
// JetStream metadata counts as a first delivery, of unknown limit.
func delivery(msg jetstream.Msg, maxDeliver int) (n uint64, last bool) {
	meta, err := msg.Metadata()
	if err != nil {
		return 1, false
	}
	return meta.NumDelivered, maxDeliver > 0 && meta.NumDelivered >= uint64(maxDeliver)
}
