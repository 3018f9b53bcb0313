package idempotency

import (
	"strconv"
	"time"
)

// Outcome says how one attempt through the core ended: a request the
// middleware covered, a call of Do, and through Do a gRPC call or a
// consumed message. It is the one answer every surface translates (see
// Result.Outcome); Class groups the outcomes by what whoever delivered the
// call should do next.
//
//	outcome                  the work                 the record                          class
//	-----------------------  -----------------------  ----------------------------------  ---------
//	OutcomeStored            ran                      COMPLETE with the result            Done
//	OutcomeOmitted           ran                      COMPLETE, the result marked omitted Done
//	                                                  (over a cap, not encodable)
//	OutcomeCommitted         ran in its transaction   COMPLETE, committed with its writes Done
//	OutcomeReplayed          did not run              COMPLETE: an earlier call's result  Done
//	OutcomeReplayedOmitted   did not run              COMPLETE, marked omitted            Done
//	OutcomeUnrecorded        ran; its effects stand   not stored: the lease was lost or   Done
//	                                                  the store failed after the work
//	OutcomeUnprotected       ran without a record     none: the store was unreachable     Done
//	                                                  and WithFailOpen ran it
//	OutcomeReleased          failed or panicked       released                            Retry
//	OutcomeInFlight          did not run              IN_PROGRESS under another call      Retry, after the holder's lease
//	OutcomeLeaseLost         rolled back              another call's                      Retry
//	OutcomeCommitUnknown     committed or rolled back unknown: a retry replays or runs    Retry
//	OutcomeStoreUnavailable  did not run              unknown: the store was unreachable  Retry
//	OutcomeStoreFull         did not run              none: the store has no room         Retry
//	OutcomeCanceled          did not run              none: the caller's context ended    Retry
//	OutcomeRefused           refused the call         released                            Permanent
//	                         for good (ErrPermanent)
//	OutcomeMismatch          did not run              another call's, untouched           Permanent
//	OutcomeCorrupt           did not run              unreadable                          Permanent
//	OutcomeTooLarge          rolled back              released                            Permanent
//	OutcomeInvalid           did not run              none: the call is malformed         Permanent
//
// OutcomeLeaseLost, OutcomeCommitUnknown and OutcomeTooLarge happen on
// transactional attempts only (WithTransaction), where the work's writes
// roll back with the record; without a transaction a work that ran and
// lost its lease is OutcomeUnrecorded, since its effects stand.
// OutcomeTooLarge is the middleware's (a response over the cap cannot be
// held until the commit); Do stores such a result marked omitted.
type Outcome uint8

// The outcomes. See Outcome for the table.
const (
	// OutcomeStored: the work ran and its result is the key's COMPLETE
	// record.
	OutcomeStored Outcome = iota + 1
	// OutcomeOmitted: the work ran; its record is COMPLETE without the
	// result, which was over a cap or could not be encoded. Duplicates get
	// OutcomeReplayedOmitted, never a second run.
	OutcomeOmitted
	// OutcomeCommitted: the work ran in its transaction, and its writes and
	// its record committed together.
	OutcomeCommitted
	// OutcomeReplayed: the key's record is COMPLETE: the stored result is
	// returned and the work did not run.
	OutcomeReplayed
	// OutcomeReplayedOmitted: the key's record is COMPLETE, but without the
	// result (see OutcomeOmitted): the work ran once, for an earlier call;
	// what survives is the status (HTTP's, a gRPC code) and, unless they
	// were omitted too, the headers.
	OutcomeReplayedOmitted
	// OutcomeUnrecorded: the work ran and its effects stand, but its record
	// was not stored: the lease was lost (another call took the key over)
	// or the store failed when completing. A duplicate after the lease may
	// run the work again.
	OutcomeUnrecorded
	// OutcomeUnprotected: the store could not be reached and WithFailOpen
	// ran the work without a record.
	OutcomeUnprotected
	// OutcomeReleased: the work failed (an error, a release status, a
	// panic) and the key was released, so that a retry runs it again.
	OutcomeReleased
	// OutcomeInFlight: another call holds the key under a live lease
	// (after the wait bound, in wait mode); Result.RetryAfter is the most
	// its lease can still run.
	OutcomeInFlight
	// OutcomeLeaseLost: a transactional attempt whose lease was lost:
	// another call took the key over, and nothing was committed.
	OutcomeLeaseLost
	// OutcomeCommitUnknown: a transactional attempt whose commit's outcome
	// is unknown: a retry with the same key replays it if it committed, or
	// runs once more if nothing did.
	OutcomeCommitUnknown
	// OutcomeStoreUnavailable: the store could not be reached, or answered
	// too slowly, before the work ran.
	OutcomeStoreUnavailable
	// OutcomeStoreFull: the store had no room for the record; nothing ran.
	OutcomeStoreFull
	// OutcomeCanceled: the caller's context ended before the record was
	// acquired; nothing ran.
	OutcomeCanceled
	// OutcomeRefused: the work refused the call for good: its error wraps
	// ErrPermanent (see Permanent; a state record's conflict does). The
	// key was released, as for OutcomeReleased, but the same call would be
	// refused again: do not retry it.
	OutcomeRefused
	// OutcomeMismatch: the key was used with another payload or by another
	// operation; the record is untouched.
	OutcomeMismatch
	// OutcomeCorrupt: the key's record cannot be read; nothing ran and
	// nothing was replayed.
	OutcomeCorrupt
	// OutcomeTooLarge: a transactional route's response was over the store
	// cap; everything was rolled back and the key released.
	OutcomeTooLarge
	// OutcomeInvalid: the call was refused before the store was asked: a
	// malformed or missing key, no principal, a request body over its cap.
	OutcomeInvalid

	outcomeEnd // one past the last outcome
)

var outcomeNames = [outcomeEnd]string{"",
	"stored", "omitted", "committed", "replayed", "replayed_omitted", "unrecorded", "unprotected",
	"released", "in_flight", "lease_lost", "commit_unknown", "store_unavailable", "store_full", "canceled",
	"refused", "mismatch", "corrupt", "too_large", "invalid"}

// String returns the outcome's lower-case name, suitable as a metric label.
func (o Outcome) String() string {
	if o > 0 && o < outcomeEnd {
		return outcomeNames[o]
	}
	return "outcome(" + strconv.Itoa(int(o)) + ")"
}

// Outcomes returns every Outcome, in order: a surface's translation table
// has a row for each, which its tests check.
func Outcomes() []Outcome {
	all := make([]Outcome, 0, outcomeEnd-1)
	for o := OutcomeStored; o < outcomeEnd; o++ {
		all = append(all, o)
	}
	return all
}

// Ran reports whether the work ran in the attempt that ended with o (under
// the lease, or unprotected), whether or not its effects stand.
func (o Outcome) Ran() bool {
	switch o {
	case OutcomeStored, OutcomeOmitted, OutcomeCommitted, OutcomeUnrecorded, OutcomeUnprotected,
		OutcomeReleased, OutcomeRefused, OutcomeLeaseLost, OutcomeCommitUnknown, OutcomeTooLarge:
		return true
	}
	return false
}

// Class groups outcomes by what the deliverer of a call (an HTTP client, a
// consumer settling a message, a gRPC client) should do next.
type Class uint8

const (
	// ClassDone: the call is over: its effect stands (it ran now, or ran
	// for an earlier call). Answer it; ack its message.
	ClassDone Class = iota + 1
	// ClassRetry: nothing stands, or nothing known; the same call with the
	// same key can succeed later. Retry after Result.RetryAfter, or a
	// backoff of the deliverer's own when that is zero.
	ClassRetry
	// ClassPermanent: the same call will never succeed: do not retry it
	// (terminate its message, answer a 4xx).
	ClassPermanent
)

var classNames = [...]string{"", "done", "retry", "permanent"}

// String returns the class's lower-case name.
func (c Class) String() string {
	if int(c) < len(classNames) && c != 0 {
		return classNames[c]
	}
	return "class(" + strconv.Itoa(int(c)) + ")"
}

// Class returns the class of o (see Outcome's table).
func (o Outcome) Class() Class {
	switch o {
	case OutcomeStored, OutcomeOmitted, OutcomeCommitted, OutcomeReplayed, OutcomeReplayedOmitted,
		OutcomeUnrecorded, OutcomeUnprotected:
		return ClassDone
	case OutcomeReleased, OutcomeInFlight, OutcomeLeaseLost, OutcomeCommitUnknown,
		OutcomeStoreUnavailable, OutcomeStoreFull, OutcomeCanceled:
		return ClassRetry
	case OutcomeRefused, OutcomeMismatch, OutcomeCorrupt, OutcomeTooLarge, OutcomeInvalid:
		return ClassPermanent
	}
	return 0
}

// retryLater is the RetryAfter of the outcomes that ask for a retry and
// say nothing of when (an unreachable store, a lost lease): the
// middleware's Retry-After for them.
const retryLater = time.Second

// ending is what the core tells a surface when an attempt ends.
type ending struct {
	outcome Outcome
	// err is the error behind the outcome: the work's own for
	// OutcomeReleased, *InFlightError, ErrFingerprintMismatch, the store's
	// wrapped, ...; nil for a plain OutcomeStored, OutcomeCommitted or
	// OutcomeReplayed.
	err error
	// epoch is the lease's epoch when the work ran and its effects stand.
	epoch uint64
	// retryAfter is when a retry may succeed, for OutcomeInFlight (the
	// holder's lease left) and the other outcomes of ClassRetry that do
	// not depend on the work (retryLater).
	retryAfter time.Duration
}

// ending returns the ending of the attempt with outcome o and err.
func (a *attempt) ending(o Outcome, err error) ending {
	e := ending{outcome: o, err: err}
	switch o {
	case OutcomeStored, OutcomeOmitted, OutcomeCommitted, OutcomeUnrecorded:
		e.epoch = a.epoch
	case OutcomeInFlight:
		e.retryAfter = a.remaining
	case OutcomeLeaseLost, OutcomeCommitUnknown, OutcomeStoreUnavailable, OutcomeStoreFull:
		e.retryAfter = retryLater
	}
	return e
}
