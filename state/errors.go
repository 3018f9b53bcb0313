package state

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/go-idempotency/idempotency"
)

// The stable codes of the errors, which their Code method returns and the
// HTTP problems (Problem) and idemgrpc's statuses carry. A code never
// changes meaning.
const (
	CodeConflict        = "state_conflict"         // *ConflictError
	CodeExists          = "state_exists"           // *ExistsError
	CodeNotFound        = "state_not_found"        // *NotFoundError
	CodeInvalidArgument = "state_invalid_argument" // *InvalidArgumentError
	CodeStoreError      = "state_store_error"      // *StoreError
)

// The sentinels the errors wrap, for errors.Is. The first four errors also
// wrap idempotency.ErrPermanent: the same call would fail the same way, so
// idempotency.Do reports its function's conflict as
// idempotency.OutcomeRefused, and a consumer terminates the message instead
// of retrying it. A StoreError does not: a retry may succeed.
var (
	ErrConflict        = errors.New("state: conflict")
	ErrExists          = errors.New("state: record exists")
	ErrNotFound        = errors.New("state: record not found")
	ErrInvalidArgument = errors.New("state: invalid argument")
	ErrStore           = errors.New("state: store error")
)

// The reasons of a ConflictError, in the order a transition checks them.
const (
	// ReasonVersion: the record's version is not the expected one; it
	// moved since the caller read it (a stale caller). Checked first.
	ReasonVersion = "version"
	// ReasonState: the version is the expected one, but the record is not
	// in the transition's From state.
	ReasonState = "state"
)

// ConflictError is the error of a Transition whose compare-and-swap did
// not match: the record's version is not the expected one (Reason
// ReasonVersion, checked first), or it is and the record is not in the
// From state (ReasonState). Nothing was written. Current is the record as
// it was found, so that the caller can answer with it, or decide again.
type ConflictError struct {
	Reason  string
	Current Record
	// Change is the transition that was refused.
	Change Change
}

func (e *ConflictError) Error() string {
	c := e.Current
	if e.Reason == ReasonVersion {
		return fmt.Sprintf("state: conflict: %s is at version %d (state %s), not at the expected version %d",
			name(c.Ref), c.Version, c.State, e.Change.ExpectedVersion)
	}
	return fmt.Sprintf("state: conflict: %s is in state %s, not %s (version %d)", name(c.Ref), c.State, e.Change.From, c.Version)
}

// Code returns CodeConflict.
func (e *ConflictError) Code() string { return CodeConflict }

// Unwrap returns ErrConflict and idempotency.ErrPermanent.
func (e *ConflictError) Unwrap() []error { return []error{ErrConflict, idempotency.ErrPermanent} }

// Metadata returns the error's members as strings: the record (machine,
// id), the reason, and its current state and version, as
// google.rpc.ErrorInfo and logs carry them.
func (e *ConflictError) Metadata() map[string]string {
	return map[string]string{
		"machine": e.Current.Machine, "id": e.Current.ID, "reason": e.Reason,
		"state": e.Current.State, "version": strconv.FormatInt(e.Current.Version, 10),
	}
}

// ExistsError is the error of a Create that found a record there already.
// Nothing was changed. Current is the stored record, so that the caller
// can tell whether it is the one it meant to create.
type ExistsError struct {
	Current Record
}

func (e *ExistsError) Error() string {
	return fmt.Sprintf("state: %s exists (state %s, version %d)", name(e.Current.Ref), e.Current.State, e.Current.Version)
}

// Code returns CodeExists.
func (e *ExistsError) Code() string { return CodeExists }

// Unwrap returns ErrExists and idempotency.ErrPermanent.
func (e *ExistsError) Unwrap() []error { return []error{ErrExists, idempotency.ErrPermanent} }

// Metadata returns the error's members as strings: the record (machine,
// id) and its state and version.
func (e *ExistsError) Metadata() map[string]string {
	return map[string]string{
		"machine": e.Current.Machine, "id": e.Current.ID,
		"state": e.Current.State, "version": strconv.FormatInt(e.Current.Version, 10),
	}
}

// NotFoundError is the error of a Get, Transition or History of a record
// that does not exist.
type NotFoundError struct {
	Ref Ref
}

func (e *NotFoundError) Error() string { return fmt.Sprintf("state: %s not found", name(e.Ref)) }

// Code returns CodeNotFound.
func (e *NotFoundError) Code() string { return CodeNotFound }

// Unwrap returns ErrNotFound and idempotency.ErrPermanent.
func (e *NotFoundError) Unwrap() []error { return []error{ErrNotFound, idempotency.ErrPermanent} }

// Metadata returns the error's members as strings: the record's machine
// and id.
func (e *NotFoundError) Metadata() map[string]string {
	return map[string]string{"machine": e.Ref.Machine, "id": e.Ref.ID}
}

// InvalidArgumentError is the error of a call refused before any
// statement ran: a name outside its grammar (see ValidScope, ValidMachine,
// ValidID, ValidState), data that is not JSON or over the cap, an expected
// version out of range.
type InvalidArgumentError struct {
	// Field names the argument: scope, machine, id, state, from, to,
	// expected_version, data, or History's after and limit.
	Field string
	// Reason says what is wrong with it.
	Reason string
}

func (e *InvalidArgumentError) Error() string {
	return fmt.Sprintf("state: invalid %s: %s", e.Field, e.Reason)
}

// Code returns CodeInvalidArgument.
func (e *InvalidArgumentError) Code() string { return CodeInvalidArgument }

// Unwrap returns ErrInvalidArgument and idempotency.ErrPermanent.
func (e *InvalidArgumentError) Unwrap() []error {
	return []error{ErrInvalidArgument, idempotency.ErrPermanent}
}

// Metadata returns the error's members as strings: the field and the
// reason.
func (e *InvalidArgumentError) Metadata() map[string]string {
	return map[string]string{"field": e.Field, "reason": e.Reason}
}

// StoreError is the error of a call whose statement failed: the database
// could not be reached, refused the statement, or the context ended. In a
// caller's transaction (a transactional route or call), the transaction
// is then aborted: answer with a status that rolls it back (WriteError
// answers 503), or return the error from Do's function. A retry may
// succeed.
type StoreError struct {
	// Op is the call: create, get, transition, history or events.
	Op  string
	Err error
}

func (e *StoreError) Error() string { return fmt.Sprintf("state: %s: %v", e.Op, e.Err) }

// Code returns CodeStoreError.
func (e *StoreError) Code() string { return CodeStoreError }

// Unwrap returns ErrStore and the database's error.
func (e *StoreError) Unwrap() []error { return []error{ErrStore, e.Err} }

// Metadata returns the error's members as strings: the call.
func (e *StoreError) Metadata() map[string]string { return map[string]string{"op": e.Op} }

// storeError wraps err, the database's, for op.
func storeError(op string, err error) error { return &StoreError{Op: op, Err: err} }
