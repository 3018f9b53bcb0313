package idempotency

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
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

// NewRunner returns a Runner keeping its records in store. The options
// that apply to it are WithTTL, WithLease, WithWait, WithMaxResponseBody
// (the cap of a stored result), WithFailOpen, WithTransaction,
// WithObserver, WithLogger and WithCodec. NewRunner panics when store is
// nil, and when an option of the middleware only (WithMethods,
// WithKeyScope, WithFingerprint...) is given.
func NewRunner(store Store, opts ...Option) *Runner {
	cfg := newConfig("NewRunner", store, opts)
	if len(cfg.httpOnly) > 0 {
		panic("idempotency: NewRunner: " + cfg.httpOnly[0] + " applies to the middleware only")
	}
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
}

// check returns what makes c unusable, if anything.
func (c Call) check() error {
	switch {
	case c.Name == "":
		return errors.New("idempotency: Do: the Call has no Name")
	case c.Key == "":
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	case len(c.Key) > MaxKeyLen:
		return errKeyTooLong
	}
	return nil
}

// Reject reports a call that a layer above Do refused before calling it (a
// malformed key in a message's metadata, a caller without a principal) to
// r's observer and logger, as the final event (EventRejected, with err) of
// a call of the operation name: so that such refusals are counted with the
// calls Do answers.
func (r *Runner) Reject(ctx context.Context, name string, err error) {
	a := &attempt{cfg: &r.cfg, ctx: ctx, start: time.Now(), describe: func() (string, string) { return name, "" }}
	a.outcome(a.event(EventRejected, 0, err))
}

// Result is what Do returns.
type Result[T any] struct {
	// Value is the function's result: returned by it now, or decoded from
	// the record when Replayed.
	Value T
	// Replayed reports that Value is the stored result of an earlier call
	// with the same key: the function did not run.
	Replayed bool
	// Epoch is the attempt that ran the function now (1 for the first,
	// +1 for each steal). It is non-zero exactly when the function ran in
	// this call and its effects stand, even when Do also returns an error
	// (its result could not be stored): 0 for a replay, for a function
	// that returned an error, and on a transactional Runner for a call
	// that committed nothing.
	Epoch uint64
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
	// ErrResultTooLarge is returned on a transactional Runner when the
	// encoded result is over WithMaxResponseBody: everything was rolled
	// back and the key released.
	ErrResultTooLarge = errors.New("idempotency: result too large to store")
	// ErrOutcomeUnknown is returned on a transactional Runner when the
	// commit's outcome is unknown: a retry with the same key replays the
	// result if it was committed, or runs the function once more if
	// nothing was.
	ErrOutcomeUnknown = errors.New("idempotency: commit outcome unknown")
)

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
// the call that ran, decoded, with Replayed set.
//
//   - fn runs under a lease, with a context that holds the call's Info
//     (FromContext) and that is cancelled, with a cause wrapping
//     ErrLeaseLost, before another call could take the record over.
//   - A result fn returns is encoded (WithCodec; []byte as it is) and
//     stored as the key's COMPLETE record. A result over
//     WithMaxResponseBody is stored without its value: Do returns it, and
//     duplicates get ErrResultOmitted. A result the Codec cannot encode is
//     stored the same way, and Do returns it with an error wrapping
//     ErrResultOmitted.
//   - An error from fn releases the key, so that a retry runs fn again,
//     and is returned as it is: there is no failed state. A result to keep
//     (a declined card) is a value, not an error. A panic releases the key
//     and is re-raised.
//   - A duplicate while the first call runs gets an *InFlightError
//     (ErrInFlight) with the time left, or, with WithWait, waits up to
//     the bound for the first call to end, woken by the store.
//   - A call with the same key and another payload or Name gets
//     ErrFingerprintMismatch.
//   - On a transactional Runner (WithTransaction), fn writes through
//     Info.Tx, and its writes and the record commit together: when Do
//     returns an error, nothing was committed (or, with ErrOutcomeUnknown,
//     the outcome is unknown and a retry settles it).
//   - When the record cannot be stored after fn ran (the lease was lost:
//     ErrLeaseLost; the store failed), Do returns fn's result with the
//     error: fn's effects happened, but a duplicate may run fn again.
//
// An error from the store before fn ran is returned wrapped, and nothing
// ran (with WithFailOpen, an unreachable store runs fn unprotected
// instead). When ctx ends before the record is acquired, Do returns its
// cause.
func Do[T any](ctx context.Context, r *Runner, c Call, fn func(ctx context.Context) (T, error)) (Result[T], error) {
	var zero Result[T]
	a := &attempt{store: r.store, cfg: &r.cfg, ctx: ctx, start: time.Now(), key: c.Key,
		describe: func() (string, string) { return c.Name, "" }}
	if err := c.check(); err != nil {
		a.outcome(a.event(EventRejected, 0, err))
		return zero, err
	}
	a.claim = r.cfg.claim(c.Scope, c.Key, callIdentity(c.Name, c.Payload))
	acq, err := a.acquire()
	if err != nil {
		if ctx.Err() != nil {
			return zero, context.Cause(ctx)
		}
		return failed(a, err, fn)
	}
	switch acq.Outcome {
	case Acquired, Stolen:
		return execute(a, acq, fn)
	case Completed:
		res, err := replayed[T](r.cfg.codec, acq.Response)
		a.outcome(a.event(EventReplayed, 0, err))
		return res, err
	case InFlight:
		a.outcome(a.event(EventConflict, 0, nil))
		return zero, &InFlightError{Remaining: acq.LeaseRemaining}
	case Mismatch:
		a.outcome(a.event(EventMismatch, 0, nil))
		return zero, ErrFingerprintMismatch
	}
	return failed(a, fmt.Errorf("idempotency: store returned unknown outcome %v", acq.Outcome), fn)
}

// failed returns the error of a call whose record could not be looked up,
// or, with WithFailOpen and a store that is unreachable or slow, runs fn
// unprotected.
func failed[T any](a *attempt, err error, fn func(ctx context.Context) (T, error)) (Result[T], error) {
	e := a.event(EventStoreError, 0, err)
	if a.cfg.failOpen && storeErrorAnswer(err).code == CodeStoreUnavailable {
		e.FailedOpen = true
		a.outcome(e)
		v, err := fn(a.ctx)
		return Result[T]{Value: v}, err
	}
	a.outcome(e)
	return Result[T]{}, fmt.Errorf("idempotency: acquire: %w", err)
}

// replayed decodes a stored result.
func replayed[T any](codec Codec, resp *Response) (Result[T], error) {
	var res Result[T]
	switch {
	case resp == nil:
		return res, fmt.Errorf("%w: COMPLETE record without a payload", ErrCorruptRecord)
	case resp.BodyOmitted || resp.HeaderOmitted:
		return res, ErrResultOmitted
	}
	if err := decode(codec, resp.Header.Get("Content-Type"), resp.Body, &res.Value); err != nil {
		if !errors.Is(err, ErrCorruptRecord) {
			err = fmt.Errorf("%w: %w", ErrCorruptRecord, err)
		}
		return Result[T]{}, err
	}
	res.Replayed = true
	return res, nil
}

// execute runs fn under the lease acq took and stores or releases its
// outcome.
func execute[T any](a *attempt, acq Acquisition, fn func(ctx context.Context) (T, error)) (Result[T], error) {
	tx, err := a.begin(acq)
	switch {
	case errors.Is(err, errBegin):
		a.outcome(a.event(EventStoreError, 0, err))
		return Result[T]{}, err
	case err != nil: // a slow acquire, released unused
		return failed(a, err, fn)
	}
	var (
		v     T
		fnErr error
	)
	l, lost := a.run(acq.Epoch, tx, func(ctx context.Context) { v, fnErr = fn(ctx) })
	if fnErr != nil {
		a.discard(l, lost, tx, 0, nil)
		return Result[T]{}, fnErr
	}
	resp, encErr := a.result(v)
	if tx != nil {
		return committed(a, l, lost, acq.Epoch, tx, v, resp, encErr)
	}
	res := Result[T]{Value: v, Epoch: acq.Epoch}
	if err := a.save(l, lost, acq.Epoch, resp, 0); err != nil {
		return res, fmt.Errorf("idempotency: the result was not stored: %w", err)
	}
	if encErr != nil {
		return res, fmt.Errorf("%w: %w", ErrResultOmitted, encErr)
	}
	return res, nil
}

// committed ends a transactional call: it commits fn's writes with the
// record holding resp, or rolls everything back and releases the key when
// the result cannot be stored whole.
func committed[T any](a *attempt, l *lease, lost error, epoch uint64, tx Tx, v T, resp *Response, encErr error) (Result[T], error) {
	switch {
	case encErr != nil:
		a.discard(l, lost, tx, 0, nil)
		return Result[T]{}, fmt.Errorf("idempotency: encode the result: %w", encErr)
	case resp.BodyOmitted:
		a.discard(l, lost, tx, 0, ErrResultTooLarge)
		return Result[T]{}, ErrResultTooLarge
	}
	err := a.commit(l, lost, tx, resp)
	switch {
	case err == nil:
		a.executed(0, epoch, lost)
		return Result[T]{Value: v, Epoch: epoch}, nil
	case errors.Is(err, ErrLeaseLost):
		a.outcome(a.event(EventLeaseLost, 0, err))
		return Result[T]{}, err
	default:
		err = fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
		a.outcome(a.event(EventStoreError, 0, err))
		return Result[T]{}, err
	}
}

// result returns the stored form of v: its encoding in the body, marked
// omitted when it is over the cap or could not be encoded (the error).
func (a *attempt) result(v any) (*Response, error) {
	body, ct, err := encode(a.cfg.codec, v)
	resp := &Response{Status: http.StatusOK, Header: http.Header{"Content-Type": {ct}}, Body: body}
	if err != nil || len(body) > a.cfg.maxResponseBody {
		resp.Body, resp.BodyOmitted = nil, true
	}
	return resp, err
}
