package state

import (
	"encoding/json"
	"fmt"
	"time"
)

// Ref names a record: its scope (the tenant), its machine (the family of
// records) and its id within them. See ValidScope, ValidMachine and
// ValidID for their grammar.
type Ref struct {
	Scope   string `json:"scope"`
	Machine string `json:"machine"`
	ID      string `json:"id"`
}

// name returns ref as errors name it: `payments.payment "pay_1" of scope
// "acme"`. Ref has no String method: Record and Event embed it, and would
// print as their Ref alone.
func name(ref Ref) string { return fmt.Sprintf("%s %q of scope %q", ref.Machine, ref.ID, ref.Scope) }

// Record is a state record as it is stored.
type Record struct {
	Ref
	State string `json:"state"`
	// Version is 1 at the creation, and grows by one with each
	// transition.
	Version int64 `json:"version"`
	// Data is the JSON the record was created with or a transition last
	// gave it, byte for byte.
	Data json.RawMessage `json:"data"`
	// CreatedAt and UpdatedAt are the database's clock at the creation
	// and at the last transition (CreatedAt until then).
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Change is a transition to make: From → To, when the record is in From at
// ExpectedVersion.
type Change struct {
	// From is the state the record must be in. It may equal To: a
	// self-transition still bumps the version and writes an event.
	From string `json:"from"`
	To   string `json:"to"`
	// ExpectedVersion is the version the caller last saw: the transition
	// is refused when the record has moved since.
	ExpectedVersion int64 `json:"expected_version"`
	// Data, when not nil, replaces the record's data (JSON, within
	// WithMaxDataBytes); nil keeps it as it is.
	Data json.RawMessage `json:"data,omitempty"`
}

// Event is a transition as it was committed: the body of its message in
// the outbox (JSON, as tagged), and an entry of its record's history.
type Event struct {
	// ID is the ID of the event's outbox message (EventID): the same for
	// every delivery of it, for downstream deduplication.
	ID string `json:"event_id"`
	Ref
	From    string `json:"from"`
	To      string `json:"to"`
	Version int64  `json:"version"` // the version the transition made
	Cause   Cause  `json:"cause"`
	// At is when the transition committed, on the database's clock: in a
	// record's history; the outbox message's EnqueuedAt says the same.
	At time.Time `json:"-"`
}

// Cause is what made a transition: the request or call of the
// idempotency middleware, idempotency.Do or a consumer in whose context it
// ran (idempotency.FromContext), and its trace context (WithTraceContext).
// It is taken from the context, never from arguments; its members are
// empty outside such a request or call.
type Cause struct {
	// Key is the Idempotency-Key (or the call's key).
	Key string `json:"key,omitempty"`
	// StorageKey is the key of its idempotency record.
	StorageKey string `json:"storage_key,omitempty"`
	// Epoch counts the attempts at that record: 1 for the first.
	Epoch uint64 `json:"epoch,omitempty"`
	// Trace is the W3C trace context of the request: traceparent and,
	// when there is one, tracestate.
	Trace map[string]string `json:"trace,omitempty"`
}
