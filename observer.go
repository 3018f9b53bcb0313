package idempotency

import (
	"context"
	"log/slog"
	"time"
)

// EventKind says what happened to a request.
type EventKind uint8

// Event kinds. Every request the middleware covers, and every call of Do,
// reports exactly one event with Final set, its outcome, last: Executed,
// Replayed, Conflict, Mismatch, Released, Rejected, Canceled, LeaseLost
// (its completion was refused) or StoreError (see Outcome for the finer
// outcome a caller of Do gets). Started,
// Stolen, and LeaseLost or StoreError for a lost lease, a failed extend or a
// failed release, are reported before it (Final false), when they
// happen.
const (
	// EventExecuted: the handler ran and its response was stored.
	EventExecuted EventKind = iota + 1
	// EventReplayed: a stored response was replayed; the handler did not run.
	EventReplayed
	// EventConflict: the original request still ran; answered 409.
	EventConflict
	// EventMismatch: the key was reused with another request; answered 422.
	EventMismatch
	// EventStolen: the record's previous owner let its lease expire; this
	// request took the record over and runs the handler.
	EventStolen
	// EventReleased: the handler failed (release status or panic) or
	// hijacked the connection; the key was released.
	EventReleased
	// EventLeaseLost: the attempt lost its lease while the handler ran or
	// when it completed; its response was not stored.
	EventLeaseLost
	// EventStoreError: a store operation failed; Err says which.
	EventStoreError
	// EventRejected: the request was refused before the store was asked
	// (bad or missing key, body too large or unreadable).
	EventRejected
	// EventStarted: the handler starts under the lease (reported in
	// addition; the final event that follows has Ran set).
	EventStarted
	// EventCanceled: the request's context ended (the client went away)
	// before the record was acquired; nothing ran.
	EventCanceled
)

var eventNames = [...]string{"", "executed", "replayed", "conflict", "mismatch", "stolen", "released", "lease_lost", "store_error", "rejected", "started", "canceled"}

// String returns the kind's lower-case name, suitable as a metric label.
func (k EventKind) String() string {
	if int(k) < len(eventNames) && k != 0 {
		return eventNames[k]
	}
	return "unknown"
}

// eventKinds is the final event of each outcome.
var eventKinds = [outcomeEnd]EventKind{
	OutcomeStored:           EventExecuted,
	OutcomeOmitted:          EventExecuted,
	OutcomeCommitted:        EventExecuted,
	OutcomeReplayed:         EventReplayed,
	OutcomeReplayedOmitted:  EventReplayed,
	OutcomeUnrecorded:       EventStoreError, // EventLeaseLost when the lease was lost
	OutcomeUnprotected:      EventStoreError, // with FailedOpen
	OutcomeReleased:         EventReleased,
	OutcomeInFlight:         EventConflict,
	OutcomeLeaseLost:        EventLeaseLost,
	OutcomeCommitUnknown:    EventStoreError,
	OutcomeStoreUnavailable: EventStoreError,
	OutcomeStoreFull:        EventStoreError,
	OutcomeCanceled:         EventCanceled,
	OutcomeRefused:          EventReleased,
	OutcomeMismatch:         EventMismatch,
	OutcomeCorrupt:          EventStoreError,
	OutcomeTooLarge:         EventReleased,
	OutcomeInvalid:          EventRejected,
}

// Event reports what happened to a request to the observer set with
// WithObserver.
type Event struct {
	Kind EventKind
	// Route names the route (see WithRoute); Method is the request method.
	Route  string
	Method string
	// Key is the storage key: a hash of scope and key, never the raw key.
	Key string
	// Status is the status sent to the client, when one was sent.
	Status int
	// Epoch is the record's attempt number, for executions.
	Epoch uint64
	// Duration is the time from the request entering the middleware to the
	// event.
	Duration time.Duration
	// Err is the error behind StoreError, LeaseLost and Released (a panic).
	Err error
	// FailedOpen reports, on a StoreError, that the handler ran unprotected.
	FailedOpen bool
	// Final marks the request's outcome: its last event, one per request.
	Final bool
	// Ran reports, on the final event, that the handler ran under the lease
	// (an EventStarted came before): a gauge of running handlers adds one
	// on Started and takes one off on a final event with Ran.
	Ran bool
}

// emit reports e to the observer and the logger, with the request's
// context ctx.
func (c *config) emit(ctx context.Context, e Event, start time.Time) {
	if c.observer == nil && c.logger == nil {
		return
	}
	e.Duration = time.Since(start)
	if c.observer != nil {
		c.observer(ctx, e)
	}
	if c.logger == nil {
		return
	}
	level := slog.LevelDebug
	switch e.Kind {
	case EventStoreError:
		level = slog.LevelError
	case EventLeaseLost, EventReleased, EventStolen:
		level = slog.LevelWarn
	case EventStarted:
		level = slog.LevelDebug - 4 // below Debug: one per execution
	}
	attrs := []slog.Attr{
		slog.String("event", e.Kind.String()),
		slog.String("route", e.Route),
		slog.String("method", e.Method),
		slog.String("key_hash", e.Key),
		slog.Duration("duration", e.Duration),
	}
	if e.Status != 0 {
		attrs = append(attrs, slog.Int("status", e.Status))
	}
	if e.Err != nil {
		attrs = append(attrs, slog.String("error", e.Err.Error()))
	}
	if e.FailedOpen {
		attrs = append(attrs, slog.Bool("failed_open", true))
	}
	c.logger.LogAttrs(ctx, level, "idempotency", attrs...)
}
