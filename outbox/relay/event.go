package relay

import (
	"context"
	"time"

	"github.com/go-idempotency/idempotency/outbox/lifecycle"
)

// EventKind says what happened in a relay.
type EventKind uint8

// Event kinds: one for each edge of the lifecycle the relay takes, and for
// its reads (lag) and failures (error).
const (
	// EventClaimed: a claim took Count messages (reported only when it
	// took some).
	EventClaimed EventKind = iota + 1
	// EventPublished: the sink confirmed the message and the relay marked
	// it done. Duration is the sink's call's (the batch's, for a
	// BatchSink); Age the time from its enqueue to the confirmation (on
	// the relay's clock against the server's).
	EventPublished
	// EventRetried: the publish failed (Err); the message waits for a
	// retry, due after Backoff.
	EventRetried
	// EventDead: the publish failed (Err) on the last allowed attempt; or,
	// with Reclaimed set, a claim ran out on it. The message is dead,
	// with the error kept. (A refused or unreadable message is dead too,
	// reported as EventRefused and EventUnreadable.)
	EventDead
	// EventReclaimed: a claim ran out before its relay marked an outcome
	// (it died, stalled or lost the database); the message waits for a
	// retry, due at once, its attempt counted.
	EventReclaimed
	// EventFenced: a mark changed nothing, because the relay's claim on
	// the message had been lost meanwhile: taken back after its lease ran
	// out (another relay presents the message again), or suspended by an
	// operator. State is the message's state as then read ("" when the
	// read failed); Published tells whether the sink had confirmed it.
	EventFenced
	// EventPurged: Count finished messages past the retention were
	// deleted.
	EventPurged
	// EventLag: Lag is how long the earliest due message has been waiting
	// (0 when none is due), read on the server's clock when the relay is
	// idle, and at most once a second while it is busy.
	EventLag
	// EventError: a statement failed (Err); the relay carries on after a
	// pause.
	EventError
	// EventExtended: the claim on Count messages that the sink is working
	// on, or that wait for their turn or their done mark, was extended by
	// a lease.
	EventExtended
	// EventClaimLost: the relay found its claim on the message lost before
	// it marked an outcome: an extend found it no longer claimed under the
	// relay's claim (canceled, suspended, or taken back: State, "" when
	// unknown), or the claim ran out without a successful extend. The
	// sink's context, if the sink had the message, was cancelled with Err,
	// a cause wrapping outbox.ErrClaimLost; a message whose turn had not
	// come is not presented.
	EventClaimLost
	// EventReleased: Count claimed messages were handed back unpresented,
	// ready again and due as they were (the relay stopped, or too little
	// of the claim was left); no attempt counted.
	EventReleased
	// EventRefused: the sink refused the message permanently (Err wraps
	// outbox.ErrPermanent); it is dead at once, with the error kept.
	EventRefused
	// EventUnreadable: the relay could not read the message's row (Err
	// says why: headers that are not a JSON object of strings, an
	// infinite time, a NULL...); it is dead at once, with the error kept,
	// and the rest of its batch went on. ID is "" when the row's storage
	// key or sequence could not be read (Err names the row).
	EventUnreadable
	// EventSuspended: the sink asked that the message wait (Err wraps
	// outbox.ErrSuspend); it is suspended with Reason until an operator
	// resumes it, the attempt not counted.
	EventSuspended
	// EventCanceled: the message was canceled (outbox.Cancel, idemctl
	// outbox cancel) while the relay presented it: its mark was refused.
	// Published tells whether the sink had confirmed it.
	EventCanceled
)

var eventNames = [...]string{"", "claimed", "published", "retried", "dead", "reclaimed", "fenced", "purged", "lag", "error",
	"extended", "claim_lost", "released", "refused", "unreadable", "suspended", "canceled"}

// EventKinds returns every event kind, in the order of their values.
func EventKinds() []EventKind {
	kinds := make([]EventKind, 0, len(eventNames)-1)
	for k := EventClaimed; int(k) < len(eventNames); k++ {
		kinds = append(kinds, k)
	}
	return kinds
}

// String returns the kind's lower-case name, suitable as a metric label.
func (k EventKind) String() string {
	if int(k) < len(eventNames) && k != 0 {
		return eventNames[k]
	}
	return "unknown"
}

// Event reports what happened in a relay to the observer set with
// WithObserver.
type Event struct {
	Kind EventKind
	// Relay is the relay's name (WithName).
	Relay string
	// ID, Topic and Attempt are the message's, for the events of one
	// message (published, retried, dead, reclaimed, fenced, claim_lost,
	// refused, unreadable, suspended, canceled).
	ID      string
	Topic   string
	Attempt int
	// Count is the number of messages, for claimed, purged, extended and
	// released.
	Count int
	// Duration is the sink's call's, for published, retried, dead,
	// refused and suspended: the Publish of the message, or the
	// PublishBatch of its batch.
	Duration time.Duration
	// Age is the time from the message's enqueue to its confirmation,
	// for published.
	Age time.Duration
	// Backoff is how long a retried message waits.
	Backoff time.Duration
	// Lag, for EventLag.
	Lag time.Duration
	// Published reports, on EventFenced and EventCanceled, that the sink
	// had confirmed the message.
	Published bool
	// Reclaimed reports, on EventDead, that the attempt that reached the
	// cap was a claim that ran out.
	Reclaimed bool
	// State is the message's state when the relay found its claim lost,
	// for fenced and claim_lost ("" when unknown).
	State lifecycle.State
	// Reason is the sink's reason, for suspended.
	Reason string
	// Err is the error behind retried, dead, error, claim_lost, refused,
	// unreadable and suspended.
	Err error
}

// emit reports e to the observer, if there is one.
func (r *Relay) emit(ctx context.Context, e Event) {
	if r.cfg.observer != nil {
		e.Relay = r.cfg.name
		r.cfg.observer(ctx, e)
	}
}
