package idemnats

import "github.com/go-idempotency/idempotency"

// settlement is what a message gets once idempotency.Do ended with an
// outcome.
type settlement int

const (
	// ack: the message is done (a confirmed ack).
	ack settlement = iota + 1
	// ackQuiet: the message is done, and the error Do returned is not
	// the consumer's concern: a duplicate of a call whose result was not
	// stored needs no stored value to be acked.
	ackQuiet
	// nak: the message is redelivered after the backoff for its delivery
	// (or Result.RetryAfter, when longer); on the consumer's last delivery
	// it is termed instead, and reported as such (ErrLastDelivery).
	nak
	// nakQuiet: naked as above, and not reported: the consumer stopped
	// (ctx ended) before the message's call could end, or while it waited
	// for another call holding its key (Process waits for the holder,
	// idempotency.WaitForHolder, keeping the message with in-progress
	// acks; Do returns InFlight only if that wait ended otherwise). The
	// message comes back, to be replayed or run.
	nakQuiet
	// term: the message is never redelivered.
	term
)

// settlements is the one translation of the core's outcome into what a
// message gets: every idempotency.Outcome has a row, which the tests check
// (see the package documentation's table for the reasons).
var settlements = map[idempotency.Outcome]settlement{
	// Done: the handler's effect stands, now or from an earlier call.
	idempotency.OutcomeStored:          ack,
	idempotency.OutcomeOmitted:         ack, // an encoding error is reported
	idempotency.OutcomeCommitted:       ack,
	idempotency.OutcomeReplayed:        ack,
	idempotency.OutcomeReplayedOmitted: ackQuiet,
	idempotency.OutcomeUnrecorded:      ack, // reported: a redelivery after the lease could run it again
	idempotency.OutcomeUnprotected:     ack,

	// Retry: nothing stands, or nothing known; the same message can
	// succeed later.
	idempotency.OutcomeReleased:         nak,
	idempotency.OutcomeInFlight:         nakQuiet,
	idempotency.OutcomeLeaseLost:        nak,
	idempotency.OutcomeCommitUnknown:    nak,
	idempotency.OutcomeStoreUnavailable: nak,
	idempotency.OutcomeStoreFull:        nak,
	idempotency.OutcomeCanceled:         nakQuiet,

	// Permanent: a redelivery would meet the same.
	idempotency.OutcomeRefused:  term, // the handler refused it for good (idempotency.ErrPermanent)
	idempotency.OutcomeMismatch: term,
	idempotency.OutcomeCorrupt:  term,
	idempotency.OutcomeTooLarge: term,
	idempotency.OutcomeInvalid:  term,
}

// settlementOf returns what a message gets for o. An outcome the table does not
// know (one added to the core since) is retried, within the consumer's
// MaxDeliver, rather than acked or dropped.
func settlementOf(o idempotency.Outcome) settlement {
	if s, ok := settlements[o]; ok {
		return s
	}
	return nak
}
