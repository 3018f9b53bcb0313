package idempotency

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"time"
)

// Runner runs functions once per key with Do, on any Store, with the
// guarantees the middleware gives HTTP handlers: a lease counted
// conservatively and extended by a heartbeat, fencing, an atomic steal
// after an owner died, the function's context cancelled before another
// call could steal, wait mode, and on a TxStore (WithTransaction) the
// function's writes committed with the record. It is safe for concurrent
// use.
type Runner struct {
	store Store
	cfg   config
}

// NewRunner returns a Runner keeping its records in store. It takes the
// CommonOptions (WithTTL, WithLease, WithWait, WithMaxResponseBody: the
// cap of a stored result, WithMaxResponseHeader, WithFailOpen,
// WithTransaction, WithObserver, WithLogger) and WithCodec. NewRunner
// panics when store is nil.
func NewRunner(store Store, opts ...RunnerOption) *Runner {
	cfg := newConfig("NewRunner", store, opts, RunnerOption.applyRunner)
	if cfg.codec == nil {
		cfg.codec = JSON
	}
	return &Runner{store: store, cfg: cfg}
}

// Call identifies one call of a function to Do.
type Call struct {
	// Name names the operation ("charge", "orders.create"). It is part of
	// the record's identity, so that one operation never replays
	// another's result under the same key, and it is the route of the
	// call's events, logs and metrics. Required.
	Name string
	// Key is the call's idempotency key (a message ID, a business key),
	// 1 to MaxKeyLen bytes, hashed with Scope into the storage key exactly
	// as an HTTP request's key is. Required.
	Key string
	// Scope is the principal that owns the key (a tenant, an account):
	// keys of different scopes never meet. "" is the key space of every
	// call without one.
	Scope string
	// Payload is what the call is about (a message's body, the request's
	// arguments). Its SHA-256, with Name, is the call's fingerprint: a
	// call with the same key and another payload gets
	// ErrFingerprintMismatch, and the record is left untouched.
	Payload []byte
	// Wait bounds how long this call waits for another call that holds its
	// key, woken by the store when that call ends, and then replays its
	// result or runs the function (wait mode, see WithWait); past it, the
	// call gets an *InFlightError. WaitForHolder waits for as long as the
	// call's context lasts: a consumer that waits so for the holder of a
	// redelivered message's key keeps the message rather than spending
	// one of its redeliveries.
	// Default: 0, the Runner's WithWait.
	Wait time.Duration
}

// WaitForHolder, as Call.Wait, waits for another call that holds the
// key for as long as the call's context lasts.
const WaitForHolder time.Duration = math.MaxInt64

// check returns what makes c unusable, if anything.
func (c Call) check() error {
	switch {
	case c.Name == "":
		return errors.New("idempotency: Do: the Call has no Name")
	case c.Key == "":
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	case len(c.Key) > MaxKeyLen:
		return errKeyTooLong
	case c.Wait < 0:
		return fmt.Errorf("idempotency: Do: negative Wait %v", c.Wait)
	}
	return nil
}

// Reject reports a call that a layer above Do refused before calling it (a
// malformed key in a message's metadata, a caller without a principal) to
// r's observer and logger, as the final event (EventRejected, with err) of
// a call of the operation name: so that such refusals are counted with the
// calls Do answers.
func (r *Runner) Reject(ctx context.Context, name string, err error) {
	rejected := newCall(ctx, r, Call{Name: name}, func(context.Context) (struct{}, error) { return struct{}{}, nil })
	rejected.report(OutcomeInvalid, 0, err)
}

// Result is what Do returns.
type Result[T any] struct {
	// Value is the function's result: returned by it now (when
	// Outcome.Ran), or decoded from the record (OutcomeReplayed; for a
	// *Response result, OutcomeReplayedOmitted too, with what survived).
	Value T
	// Outcome says how the call ended; its Class what its deliverer
	// should do next. See Outcome for the table.
	Outcome Outcome
	// Replayed reports that Value is the stored result of an earlier call
	// with the same key: the function did not run (OutcomeReplayed).
	Replayed bool
	// Epoch is the attempt that ran the function now (1 for the first,
	// +1 for each steal). It is non-zero exactly when the function ran in
	// this call and its effects stand, even when Do also returns an error
	// (OutcomeUnrecorded: its result could not be stored): 0 for a replay,
	// for a function that returned an error, and on a transactional Runner
	// for a call that committed nothing.
	Epoch uint64
	// RetryAfter is, for an outcome of ClassRetry, when a retry with the
	// same key may succeed: the time the holder's lease can still run for
	// OutcomeInFlight, a second for an unreachable store or a lost lease;
	// 0 when it depends on the function (OutcomeReleased) or the caller.
	RetryAfter time.Duration
}

// Errors of Do. The errors of the store (ErrStoreFull, ErrCorruptRecord,
// ErrLeaseLost, an unreachable store) are returned wrapped.
var (
	// ErrInFlight is wrapped by the *InFlightError Do returns while
	// another call with the same key still runs.
	ErrInFlight = errors.New("idempotency: call in flight")
	// ErrFingerprintMismatch is returned for a key used before with
	// another payload or by another operation; the record is untouched.
	ErrFingerprintMismatch = errors.New("idempotency: key used with a different call")
	// ErrResultOmitted is returned to a duplicate whose original's result
	// was not stored: over WithMaxResponseBody, over a store's bound, or
	// not encodable. The function ran once; its value is unknown here.
	ErrResultOmitted = errors.New("idempotency: result not stored")
	// ErrPermanent is wrapped by an error that refuses a call for good: the
	// same call would be refused again (a state record's conflict, a
	// payload no downstream accepts). Do releases the key for such an
	// error of the function, as for any error, and reports
	// OutcomeRefused, of ClassPermanent, so that a consumer terminates
	// the message rather than retry it. See Permanent.
	ErrPermanent = errors.New("idempotency: refused permanently")
	// ErrOutcomeUnknown is returned on a transactional Runner when the
	// commit's outcome is unknown: a retry with the same key replays the
	// result if it was committed, or runs the function once more if
	// nothing was.
	ErrOutcomeUnknown = errors.New("idempotency: commit outcome unknown")
)

// permanentError is an error marked by Permanent.
type permanentError struct{ err error }

func (e permanentError) Error() string   { return e.err.Error() }
func (e permanentError) Unwrap() []error { return []error{ErrPermanent, e.err} }

// Permanent returns err marked as a refusal for good: an error with err's
// text that wraps both ErrPermanent and err. It returns nil when err is
// nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// InFlightError is the error of a call whose key is held by another call
// still running (after the wait bound, in wait mode). It wraps ErrInFlight.
type InFlightError struct {
	// Remaining is the longest the other call's lease can still run
	// before a duplicate could take the record over.
	Remaining time.Duration
}

func (e *InFlightError) Error() string {
	return "idempotency: call in flight; its lease ends within " + e.Remaining.String()
}

func (e *InFlightError) Unwrap() error { return ErrInFlight }

// errCodec reports a result stored under another content type than the
// Codec reading it.
func errCodec(stored, want string) error {
	return fmt.Errorf("%w: result stored as %q, read as %q", ErrCorruptRecord, stored, want)
}

// callIdentity is the fingerprint of a call: its name and the SHA-256 of
// its payload, hashed as a request's route and fingerprint are, with an
// empty method, which no HTTP request has, so that a call never shares an
// identity with a request.
func callIdentity(name string, payload []byte) string {
	sum := sha256.Sum256(payload)
	return requestIdentity("", name, string(sum[:]))
}

// Do runs fn once per (c.Scope, c.Key) among every call of r's store, and
// returns its result: fn's own, or, for a duplicate, the stored result of
// the call that ran, decoded, with Replayed set. Result.Outcome says how
// the call ended (see Outcome), and the error, when there is one, why.
//
//   - fn runs under a lease, with a context that holds the call's Info
//     (FromContext) and that is cancelled, with a cause wrapping
//     ErrLeaseLost, before another call could take the record over.
//   - A result fn returns is encoded (WithCodec; a []byte as it is, a
//     *Response as the response it is) and stored as the key's COMPLETE
//     record: OutcomeStored (OutcomeCommitted on a transactional Runner).
//     A result over WithMaxResponseBody is stored without its value
//     (OutcomeOmitted): Do returns it, and duplicates get
//     ErrResultOmitted. A result the Codec cannot encode is stored the
//     same way, and Do returns it with an error wrapping ErrResultOmitted.
//   - An error from fn releases the key (OutcomeReleased), so that a retry
//     runs fn again, and is returned as it is: there is no failed state. A
//     result to keep (a declined card) is a value, not an error. An error
//     wrapping ErrPermanent releases the key too, and is reported as
//     OutcomeRefused: a retry would be refused again. A panic releases the
//     key and is re-raised.
//   - A duplicate while the first call runs gets an *InFlightError
//     (ErrInFlight, OutcomeInFlight) with the time left, or, with
//     WithWait, waits up to the bound for the first call to end, woken by
//     the store.
//   - A call with the same key and another payload or Name gets
//     ErrFingerprintMismatch (OutcomeMismatch).
//   - On a transactional Runner (WithTransaction), fn writes through
//     Info.Tx, and its writes and the record commit together: when Do
//     returns an error, nothing was committed (OutcomeLeaseLost), or, with
//     ErrOutcomeUnknown (OutcomeCommitUnknown), the outcome is unknown and
//     a retry settles it.
//   - When the record cannot be stored after fn ran (the lease was lost:
//     ErrLeaseLost; the store failed), Do returns fn's result with the
//     error (OutcomeUnrecorded): fn's effects happened, but a duplicate
//     may run fn again.
//
// An error from the store before fn ran is returned wrapped, and nothing
// ran (with WithFailOpen, an unreachable store runs fn unprotected
// instead: OutcomeUnprotected). When ctx ends before the record is
// acquired, Do returns its cause (OutcomeCanceled).
func Do[T any](ctx context.Context, r *Runner, c Call, fn func(ctx context.Context) (T, error)) (Result[T], error) {
	run := newCall(ctx, r, c, fn)
	if err := c.check(); err != nil {
		run.refuse(err)
		return run.res, run.err
	}
	run.claim = r.cfg.claim(c.Scope, c.Key, callIdentity(c.Name, c.Payload))
	run.waitFor = r.cfg.wait
	if c.Wait != 0 {
		run.waitFor = c.Wait
	}
	run.do()
	return run.res, run.err
}

// call is a call of Do: an attempt, and its caller.
type call[T any] struct {
	attempt
	name  string
	fn    func(ctx context.Context) (T, error)
	res   Result[T] // Value: what fn returned, or the replayed result
	fnErr error     // fn's error
	err   error     // Do's error
}

// newCall returns the call of fn that c describes, on r: one allocation
// for the attempt and its caller.
func newCall[T any](ctx context.Context, r *Runner, c Call, fn func(ctx context.Context) (T, error)) *call[T] {
	run := &call[T]{name: c.Name, fn: fn}
	run.attempt = attempt{store: r.store, cfg: &r.cfg, caller: run, ctx: ctx, start: time.Now(), key: c.Key}
	return run
}

// describe names the call's events: the route is its operation.
func (c *call[T]) describe() (route, method string) { return c.name, "" }

// work runs fn.
func (c *call[T]) work(ctx context.Context) { c.res.Value, c.fnErr = c.fn(ctx) }

// result returns the record of fn's result, or, when fn failed, nil and
// its error.
func (c *call[T]) result() (*Response, error) {
	if c.fnErr != nil {
		return nil, c.fnErr
	}
	return record(c.cfg, c.res.Value)
}

// replay decodes a stored result into the call's Value: a record marked
// omitted is ErrResultOmitted (a *Response result still gets what
// survived), one that cannot be decoded ErrCorruptRecord.
func (c *call[T]) replay(resp *Response) error {
	omitted := resp.BodyOmitted || resp.HeaderOmitted
	if _, response := any(c.res.Value).(*Response); omitted && !response {
		return ErrResultOmitted
	}
	if err := decode(c.cfg.codec, resp, &c.res.Value); err != nil {
		var zero T
		c.res.Value = zero
		if !errors.Is(err, ErrCorruptRecord) {
			err = fmt.Errorf("%w: %w", ErrCorruptRecord, err)
		}
		return err
	}
	if omitted {
		return ErrResultOmitted
	}
	return nil
}

// settle returns the ending as Do's result and error: fn's value when its
// effects stand (or it ran unprotected), the decoded one for a replay.
func (c *call[T]) settle(e ending) int {
	c.res.Outcome, c.res.Epoch, c.res.RetryAfter = e.outcome, e.epoch, e.retryAfter
	switch e.outcome {
	case OutcomeStored, OutcomeOmitted, OutcomeCommitted, OutcomeUnrecorded, OutcomeUnprotected:
		// Value is fn's.
	case OutcomeReplayed:
		c.res.Replayed = true
	case OutcomeReplayedOmitted: // Value holds what survived of a *Response
	default:
		var zero T
		c.res.Value = zero
	}
	c.err = e.err
	return 0
}
