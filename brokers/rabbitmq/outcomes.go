package idemrabbit

import "github.com/go-idempotency/idempotency"

// disposition is what a delivery gets for the outcome of its call of Do.
type disposition uint8

const (
	// ack: the handler's effect stands (it ran now, or for an earlier
	// delivery).
	ack disposition = iota + 1
	// retry: nothing stands, or nothing known; the same delivery can
	// succeed later. It is held for the backoff, then requeued; the last
	// delivery is rejected instead, and reported.
	retry
	// wait: another call holds the key. Process keeps the delivery
	// unacked while Do waits for the holder (idempotency.WaitForHolder),
	// so Do returns this only when that wait ended otherwise: it is
	// requeued at once (rejected and reported when it is the last).
	wait
	// reject: the same delivery can never succeed.
	reject
)

// rule is a row of the table.
type rule struct {
	action disposition
	// quiet: the error that comes with the outcome is expected, and not
	// returned.
	quiet bool
}

// settlements is the one table from the outcomes of idempotency.Do to
// what a delivery gets: Process translates res.Outcome through it, and
// nothing else. Its test checks that every outcome has a row.
var settlements = map[idempotency.Outcome]rule{
	idempotency.OutcomeStored:    {action: ack},
	idempotency.OutcomeOmitted:   {action: ack}, // the error, if any, says the result could not be encoded
	idempotency.OutcomeCommitted: {action: ack},
	idempotency.OutcomeReplayed:  {action: ack},
	// The handler ran once, for an earlier delivery; a consumer needs no
	// stored value, so ErrResultOmitted is no failure here.
	idempotency.OutcomeReplayedOmitted: {action: ack, quiet: true},
	// Its effects stand, though a duplicate after the lease may run the
	// handler again: the error is returned and reported.
	idempotency.OutcomeUnrecorded:  {action: ack},
	idempotency.OutcomeUnprotected: {action: ack},

	idempotency.OutcomeReleased:         {action: retry}, // the handler's error, or its panic
	idempotency.OutcomeInFlight:         {action: wait},
	idempotency.OutcomeLeaseLost:        {action: retry}, // nothing was committed
	idempotency.OutcomeCommitUnknown:    {action: retry}, // the redelivery replays or runs once
	idempotency.OutcomeStoreUnavailable: {action: retry},
	idempotency.OutcomeStoreFull:        {action: retry},
	idempotency.OutcomeCanceled:         {action: retry}, // ctx ended: no backoff is held

	idempotency.OutcomeRefused:  {action: reject}, // the handler refused it for good (idempotency.ErrPermanent)
	idempotency.OutcomeMismatch: {action: reject},
	idempotency.OutcomeCorrupt:  {action: reject},
	idempotency.OutcomeTooLarge: {action: reject}, // the middleware's; Do never returns it
	idempotency.OutcomeInvalid:  {action: reject}, // no message_id, or one over idempotency.MaxKeyLen
}

// settlementOf returns the row of o. An outcome without one (none, as
// the table's test checks) is retried: that spends the message's
// deliveries, but never drops a message whose handler may not have run.
func settlementOf(o idempotency.Outcome) rule {
	if r, ok := settlements[o]; ok {
		return r
	}
	return rule{action: retry}
}
