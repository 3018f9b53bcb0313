package relay

import (
	"context"
	"time"
)

// EventKind says what happened in a relay.
type EventKind uint8

// Event kinds.
const (
	// EventClaimed: a claim took Count messages (reported only when it
	// took some).
	EventClaimed EventKind = iota + 1
	// EventPublished: the sink confirmed the message and the relay marked
	// it done. Duration is the publish's; Age the time from its enqueue
	// to the confirmation (on the relay's clock against the server's).
	EventPublished
	// EventRetried: the publish failed (Err); the message is pending
	// again, due after Backoff.
	EventRetried
	// EventDead: the publish failed (Err) on the last allowed attempt; or,
	// with Reclaimed set, a claim ran out on it. The message is dead,
	// with the error kept.
	EventDead
	// EventReclaimed: a claim ran out before its relay marked an outcome
	// (it died, stalled or lost the database); the message is pending
	// again, its attempt counted.
	EventReclaimed
	// EventFenced: a mark changed nothing, because the claim had been
	// taken back meanwhile (after its lease ran out): another relay
	// presents the message again. Published tells whether the sink had
	// confirmed it.
	EventFenced
	// EventPurged: Count terminal messages past the retention were deleted.
	EventPurged
	// EventLag: Lag is how long the earliest due message has been waiting
	// (0 when none is due), read on the server's clock when the relay is
	// idle, and at most once a second while it is busy.
	EventLag
	// EventError: a statement failed (Err); the relay carries on after a
	// pause.
	EventError
)

var eventNames = [...]string{"", "claimed", "published", "retried", "dead", "reclaimed", "fenced", "purged", "lag", "error"}

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
	// message (published, retried, dead, reclaimed, fenced).
	ID      string
	Topic   string
	Attempt int
	// Count is the number of messages, for claimed and purged.
	Count int
	// Duration is the publish's, for published, retried and dead.
	Duration time.Duration
	// Age is the time from the message's enqueue to its confirmation,
	// for published.
	Age time.Duration
	// Backoff is how long a retried message waits.
	Backoff time.Duration
	// Lag, for EventLag.
	Lag time.Duration
	// Published reports, on EventFenced, that the sink had confirmed the
	// message.
	Published bool
	// Reclaimed reports, on EventDead, that the attempt that reached the
	// cap was a claim that ran out.
	Reclaimed bool
	// Err is the error behind retried, dead and error.
	Err error
}

// emit reports e to the observer, if there is one.
func (r *Relay) emit(ctx context.Context, e Event) {
	if r.cfg.observer != nil {
		e.Relay = r.cfg.name
		r.cfg.observer(ctx, e)
	}
}
