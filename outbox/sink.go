package outbox

import (
	"context"
	"errors"

	"github.com/go-idempotency/idempotency"
)

// Sink publishes envelopes. Publish returns nil only once the broker
// confirmed the message (JetStream's ack, RabbitMQ's publisher confirm).
// Any other error means it may or may not have been published, and the
// relay presents it again later (at least once), except for two kinds of
// error that say what to do instead:
//
//   - an error wrapping ErrPermanent (see Permanent): the message can never
//     be published (a subject the broker refuses); the relay marks it dead
//     at once, with the error as its last error;
//   - an error wrapping ErrSuspend (see Suspend): the message must wait (a
//     budget exhausted, a downstream closed); the relay suspends it with
//     the reason, until an operator resumes it (idemctl outbox resume),
//     and the attempt is not counted.
//
// The relay extends its claim on the message while Publish runs, and
// cancels ctx, with a cause wrapping ErrClaimLost, before the claim could
// be taken back (an extend that failed for most of a lease), or as soon as
// an extend finds the message no longer claimed (an operator canceled or
// suspended it, or another relay took it back): return soon after ctx
// ends. A relay with relay.WithConcurrency above 1 calls Publish from
// several goroutines at once, each with a message of another ordering key.
type Sink interface {
	Publish(ctx context.Context, e Envelope) error
}

// SinkFunc is a function as a Sink.
type SinkFunc func(ctx context.Context, e Envelope) error

// Publish calls f.
func (f SinkFunc) Publish(ctx context.Context, e Envelope) error { return f(ctx, e) }

// The errors of the sink's contract.
var (
	// ErrPermanent is wrapped by a sink's error that refuses a message for
	// good: the relay marks it dead at once instead of retrying it. It is
	// idempotency.ErrPermanent, so that a local run whose function is
	// refused for good (idempotency.OutcomeRefused) refuses its message.
	ErrPermanent = idempotency.ErrPermanent
	// ErrSuspend is wrapped by a sink's error that asks that a message
	// wait: the relay suspends it, without counting the attempt.
	ErrSuspend = errors.New("outbox: suspended by the sink")
	// ErrClaimLost is wrapped by the cause of a sink's context that the
	// relay cancelled because its claim on the message is lost, or about
	// to be: the message was canceled or suspended, or another relay may
	// take it back. What the sink does after that is not marked.
	ErrClaimLost = errors.New("outbox: the relay's claim on the message is lost")
)

// Permanent returns err marked as a permanent refusal: an error wrapping
// both ErrPermanent and err, with err's text (idempotency.Permanent). It
// returns nil when err is nil.
func Permanent(err error) error { return idempotency.Permanent(err) }

// suspendError is the error of Suspend.
type suspendError struct{ reason string }

func (e suspendError) Error() string { return ErrSuspend.Error() + ": " + e.reason }
func (e suspendError) Unwrap() error { return ErrSuspend }

// Suspend returns the error a sink returns to have the relay suspend the
// message, with reason as its suspended_reason: it wraps ErrSuspend.
func Suspend(reason string) error { return suspendError{reason} }

// SuspendReason returns the reason given to Suspend, when err wraps an
// error of Suspend; err's text for any other error; "" for nil.
func SuspendReason(err error) string {
	var s suspendError
	if errors.As(err, &s) {
		return s.reason
	}
	if err == nil {
		return ""
	}
	return err.Error()
}
