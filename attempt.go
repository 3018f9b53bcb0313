package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// attempt is one caller's turn at a record: the core every surface shares
// (the middleware's requests, Do's calls, and through Do gRPC calls and
// consumed messages). It owns the record's lifecycle, and its steps read in
// the order they happen:
//
//	do        acquire the record, waiting for another holder in wait mode
//	          ├ Completed     replay: the caller gets the stored record
//	          ├ InFlight, Mismatch, a store error: end, refused
//	          └ Acquired, Stolen: execute
//	execute   begin: a lease that took too long to get is given back; a
//	          transaction begins on a transactional route or Runner
//	          runWork: the caller's work under the lease, with a heartbeat
//	          then, with what the work produced (caller.result):
//	          ├ nothing to keep   releaseUnstored, end Released
//	          ├ a transaction     commit: the record with the work's writes
//	          └ otherwise         complete: the record
//	end       the caller settles the Outcome (answers, returns); the final
//	          event reports it
//
// The attempt carries everything a step needs: the claim it presents to
// the store, and from begin on the epoch, the transaction, the lease and a
// loss of the lease. The one way it lets a key go is releaseUnstored.
type attempt struct {
	store  Store
	cfg    *config
	caller caller
	// ctx is the caller's context: its values reach events, logs and store
	// calls; its cancellation ends an acquire or a wait, never the store
	// calls after the work ran.
	ctx   context.Context
	claim AcquireRequest // key, token, fingerprint, lease and TTL of every store call
	key   string         // the caller's key, for Info
	// waitFor bounds the wait for another holder of the key (wait mode):
	// WithWait, or a Call's Wait; WaitForHolder waits as long as ctx lasts.
	waitFor time.Duration
	start   time.Time
	sent    time.Time // when the last Acquire was sent: the lease counts from it

	// From begin on.
	epoch uint64
	tx    Tx     // the work's transaction, on a transactional attempt
	lease *lease // the heartbeat, from the start of the work
	lost  error  // why the lease was lost while the work ran, if it was
	// remaining is, for OutcomeInFlight, the most the holder's lease can
	// still run.
	remaining time.Duration
	// ran: the work started; unprotected: it ran without a record (fail
	// open); lossNoted: the loss was reported.
	ran, unprotected, lossNoted bool
}

// caller is the surface an attempt runs for: the middleware's request, a
// call of Do. The attempt calls it back at each step that is the
// surface's: its work, what the work produced, a replay, and the answer.
type caller interface {
	// work runs the caller's work, with ctx: under the lease (ctx holds the
	// attempt's Info and is cancelled when the lease is lost), or, when the
	// attempt fails open, unprotected.
	work(ctx context.Context)
	// result returns what the work produced, once it returned: the record
	// to store, or nil to let the key go (err: why, when the work failed;
	// errResponseTooLarge for a transactional response over the cap). With
	// a record, err says why it is marked omitted, when that is not a cap.
	// On an attempt without a transaction the caller delivers its answer
	// before result returns a record: the record is stored after the
	// caller was answered.
	result() (*Response, error)
	// replay gives the caller the record a duplicate found. An error
	// wrapping ErrCorruptRecord says it cannot be read; any other error is
	// reported with the replay (the client went away).
	replay(resp *Response) error
	// settle answers the caller for how the attempt ended, and returns the
	// HTTP status sent, for the final event (0 when there is none).
	settle(e ending) (status int)
	// describe names the route and method of the attempt's events.
	describe() (route, method string)
}

// do runs the attempt: acquire, then replay, execute or refuse.
func (a *attempt) do() {
	acq, err := a.acquire()
	switch {
	case err != nil:
		a.acquireFailed(err)
	case acq.Outcome == Acquired || acq.Outcome == Stolen:
		a.execute(acq)
	case acq.Outcome == Completed:
		a.replay(acq.Response)
	case acq.Outcome == InFlight:
		a.remaining = acq.LeaseRemaining
		a.end(OutcomeInFlight, &InFlightError{Remaining: acq.LeaseRemaining})
	case acq.Outcome == Mismatch:
		a.end(OutcomeMismatch, ErrFingerprintMismatch)
	default:
		a.acquireFailed(fmt.Errorf("idempotency: store returned unknown outcome %v", acq.Outcome))
	}
}

// refuse ends an attempt that its caller refused before the store was
// asked (a malformed key, no principal): OutcomeInvalid, with err.
func (a *attempt) refuse(err error) { a.end(OutcomeInvalid, err) }

// acquire asks the store for the record; in wait mode, it waits for a
// record held by another caller (see wait). An error means nothing was
// acquired: the store failed, or ctx ended.
func (a *attempt) acquire() (Acquisition, error) {
	acq, err := a.send(a.ctx)
	if err == nil && acq.Outcome == InFlight && a.waitFor > 0 {
		acq, err = a.wait(acq)
	}
	return acq, err
}

// send calls Acquire, noting when the call was sent.
func (a *attempt) send(ctx context.Context) (Acquisition, error) {
	a.sent = time.Now()
	return a.store.Acquire(ctx, a.claim)
}

// acquireFailed ends an attempt whose record could not be had: the
// caller's context ended (nothing runs, above all not unprotected), or the
// store failed. With WithFailOpen, an unreachable or slow store runs the
// work unprotected instead.
func (a *attempt) acquireFailed(err error) {
	if a.ctx.Err() != nil {
		a.end(OutcomeCanceled, context.Cause(a.ctx))
		return
	}
	o := storeFailure(err)
	if o == OutcomeStoreUnavailable && a.cfg.failOpen {
		a.runUnprotected(err)
		return
	}
	a.end(o, fmt.Errorf("idempotency: acquire: %w", err))
}

// storeFailure is the outcome of an attempt whose acquire failed with err.
func storeFailure(err error) Outcome {
	switch {
	case errors.Is(err, ErrStoreFull):
		return OutcomeStoreFull
	case errors.Is(err, ErrCorruptRecord):
		return OutcomeCorrupt
	}
	return OutcomeStoreUnavailable // unreachable, or a slowAcquireError
}

// runUnprotected runs the work without a record, because the store failed
// with cause and the attempt fails open. The final event reports cause.
func (a *attempt) runUnprotected(cause error) {
	a.unprotected, a.ran = true, true
	panicked := true
	defer func() {
		if panicked { // the event still reports the run; the panic goes on
			a.report(OutcomeReleased, 0, cause)
		}
	}()
	a.caller.work(a.ctx)
	panicked = false
	o, err := OutcomeUnprotected, error(nil)
	if resp, workErr := a.caller.result(); resp == nil {
		o, err = failure(workErr), workErr
	}
	status := a.caller.settle(a.ending(o, err))
	a.report(o, status, cause)
}

// failure is the outcome of work that failed with err: refused for good
// when err wraps ErrPermanent, released otherwise.
func failure(err error) Outcome {
	if errors.Is(err, ErrPermanent) {
		return OutcomeRefused
	}
	return OutcomeReleased
}

// replay gives the caller the record a duplicate found.
func (a *attempt) replay(resp *Response) {
	if resp == nil {
		a.end(OutcomeCorrupt, fmt.Errorf("%w: COMPLETE record without a payload", ErrCorruptRecord))
		return
	}
	o := OutcomeReplayed
	if resp.BodyOmitted || resp.HeaderOmitted {
		o = OutcomeReplayedOmitted
	}
	err := a.caller.replay(resp)
	if errors.Is(err, ErrCorruptRecord) {
		o = OutcomeCorrupt
	}
	a.end(o, err)
}

// execute runs the work under the lease acq took, then stores what it
// produced (commits it with the work's writes, on a transactional attempt)
// or lets the key go.
func (a *attempt) execute(acq Acquisition) {
	if err := a.begin(acq); err != nil {
		var slow *slowAcquireError
		if errors.As(err, &slow) {
			a.acquireFailed(err)
		} else {
			a.end(OutcomeStoreUnavailable, err)
		}
		return
	}
	a.runWork()
	resp, err := a.caller.result()
	switch {
	case resp == nil && errors.Is(err, errResponseTooLarge):
		a.releaseUnstored()
		a.end(OutcomeTooLarge, err)
	case resp == nil:
		a.releaseUnstored()
		a.end(failure(err), err)
	case a.tx != nil:
		a.commit(resp, err)
	default:
		a.complete(resp, err)
	}
}

// slowAcquireError reports an acquire that took so much of the lease that
// too little was left to run the work (see minLeaseToStart).
type slowAcquireError struct{ took, lease time.Duration }

func (e *slowAcquireError) Error() string {
	return fmt.Sprintf("idempotency: the acquire took %v of a %v lease; the lease was released unused", e.took, e.lease)
}

// errBegin wraps the error of a transaction that could not begin.
var errBegin = errors.New("idempotency: begin transaction")

// begin prepares to run the work under the lease that acq took: it refuses
// a lease whose acquire took more than half of it (released unused, a
// *slowAcquireError), reports a steal, and on a transactional attempt
// begins the transaction (the key is released when it cannot: an error
// wrapping errBegin).
func (a *attempt) begin(acq Acquisition) error {
	if took := time.Since(a.sent); a.cfg.lease-took < minLeaseToStart(a.cfg.lease) {
		a.releaseUnstored()
		return &slowAcquireError{took: took, lease: a.cfg.lease}
	}
	a.epoch = acq.Epoch
	if acq.Outcome == Stolen {
		e := a.event(EventStolen, 0, nil)
		e.Epoch = acq.Epoch
		a.cfg.emit(a.ctx, e, a.start) // in addition to the outcome
	}
	if !a.cfg.transaction {
		return nil
	}
	ctx, cancel := a.storeCallContext()
	defer cancel()
	tx, err := a.store.(TxStore).BeginTx(ctx, a.claim.Key, a.claim.Token)
	if err != nil {
		a.releaseUnstored()
		return fmt.Errorf("%w: %w", errBegin, err)
	}
	a.tx = tx
	return nil
}

// runWork runs the caller's work under the lease, with a context that
// holds the attempt's Info (FromContext) and that the lease cancels, with a
// cause wrapping ErrLeaseLost, when it is lost. When the work panics, the
// key is let go, the outcome reported and the panic re-raised.
func (a *attempt) runWork() {
	info := &Info{Key: a.key, StorageKey: a.claim.Key, Epoch: a.epoch}
	if a.tx != nil {
		info.Tx = a.tx.Handle()
	}
	ctx, cancel := context.WithCancelCause(context.WithValue(a.ctx, infoKey{}, info))
	defer cancel(nil)
	a.lease = &lease{store: a.store, ctx: a.storeContext(), key: a.claim.Key, token: a.claim.Token, length: a.cfg.lease, lose: cancel}
	a.lease.start(a.sent)

	panicked := true
	defer func() {
		if !panicked {
			return
		}
		v := recover()
		a.stopLease()
		a.releaseUnstored()
		if v == nil { // runtime.Goexit: let it go on
			a.report(OutcomeReleased, 0, errors.New("idempotency: handler exited"))
			return
		}
		a.report(OutcomeReleased, 0, fmt.Errorf("idempotency: handler panicked: %v", v))
		panic(v)
	}()
	a.note(EventStarted, 0, nil)
	a.ran = true
	a.caller.work(ctx)
	panicked = false
	a.stopLease()
}

// stopLease stops the heartbeat and keeps the loss, if the lease was lost;
// a failed extend the lease survived is noted.
func (a *attempt) stopLease() {
	lost, extendErr := a.lease.stop()
	a.lost = lost
	if lost == nil && extendErr != nil {
		a.note(EventStoreError, 0, fmt.Errorf("idempotency: extend: %w", extendErr))
	}
}

// completeAttempts bounds the attempts of a Complete whose outcome is
// unknown (a store error); each presents the same lease, and all of them end
// at the lease's store deadline (see lease.storeDeadline).
const completeAttempts = 3

// complete stores resp as the record, retrying a Complete whose outcome is
// unknown (a store error) with the same lease until the store deadline.
// omitted says why resp is marked omitted, when that is not a cap.
func (a *attempt) complete(resp *Response, omitted error) {
	ctx, cancel := a.storeCallContext()
	defer cancel()
	err := a.store.Complete(ctx, a.claim.Key, a.claim.Token, resp, a.cfg.ttl)
	for i := 1; i < completeAttempts && err != nil && !errors.Is(err, ErrLeaseLost) && ctx.Err() == nil; i++ {
		select {
		case <-time.After(time.Duration(i) * 20 * time.Millisecond):
			err = a.store.Complete(ctx, a.claim.Key, a.claim.Token, resp, a.cfg.ttl)
		case <-ctx.Done():
		}
	}
	switch {
	case err != nil:
		a.end(OutcomeUnrecorded, fmt.Errorf("idempotency: the result was not stored: complete: %w", err))
	case resp.BodyOmitted || resp.HeaderOmitted:
		if omitted != nil {
			omitted = fmt.Errorf("%w: %w", ErrResultOmitted, omitted)
		}
		a.end(OutcomeOmitted, omitted)
	default:
		a.end(OutcomeStored, nil)
	}
}

// commit completes the record with resp in the work's transaction and
// commits: both land (OutcomeCommitted, or OutcomeOmitted for a record
// marked omitted), or neither (OutcomeLeaseLost: another call took the
// key over), or the outcome is unknown (OutcomeCommitUnknown: the key is
// released in case nothing landed).
func (a *attempt) commit(resp *Response, omitted error) {
	ctx, cancel := a.storeCallContext()
	defer cancel()
	err := a.tx.Complete(ctx, resp, a.cfg.ttl)
	switch {
	case err == nil && (resp.BodyOmitted || resp.HeaderOmitted):
		if omitted != nil {
			omitted = fmt.Errorf("%w: %w", ErrResultOmitted, omitted)
		}
		a.end(OutcomeOmitted, omitted)
	case err == nil:
		a.end(OutcomeCommitted, nil)
	case errors.Is(err, ErrLeaseLost):
		_ = a.tx.Rollback(ctx)
		a.end(OutcomeLeaseLost, err)
	default:
		// Either both the work's writes and the record landed, or neither
		// did: the release frees the key only in the second case.
		a.releaseUnstored()
		a.end(OutcomeCommitUnknown, fmt.Errorf("%w: %w", ErrOutcomeUnknown, err))
	}
}

// releaseUnstored lets the key go: the one way an attempt does, used
// whenever it stores nothing (or cannot know that it did): a lease taken
// too slowly or without a transaction to run in, work that failed or
// panicked, a response too large to hold, a commit of unknown outcome. It
// rolls the work's transaction back first, when there is one, and reports
// a lease lost meanwhile and a release that failed.
func (a *attempt) releaseUnstored() {
	ctx, cancel := a.storeCallContext()
	defer cancel()
	if a.tx != nil {
		_ = a.tx.Rollback(ctx)
	}
	a.noteLoss()
	err := a.store.Release(ctx, a.claim.Key, a.claim.Token)
	switch {
	case err == nil:
	case errors.Is(err, ErrLeaseLost):
		if a.lost == nil {
			a.note(EventLeaseLost, 0, err)
		}
	default:
		a.note(EventStoreError, 0, fmt.Errorf("idempotency: release: %w", err))
	}
}

// storeContext is the context of the store calls made for the attempt: the
// caller's values without its cancellation, since the work's effect
// happened whether or not the caller stays.
func (a *attempt) storeContext() context.Context { return context.WithoutCancel(a.ctx) }

// storeCallContext bounds a store call of the attempt: before the work, by
// the time the heartbeat gives one extend; after it, by the lease's store
// deadline (see lease.storeDeadline).
func (a *attempt) storeCallContext() (context.Context, context.CancelFunc) {
	if a.lease == nil {
		return context.WithTimeout(a.storeContext(), heartbeat(a.cfg.lease))
	}
	return context.WithDeadline(a.lease.ctx, a.lease.storeDeadline())
}

// end settles the attempt with its caller and reports the outcome.
func (a *attempt) end(o Outcome, err error) {
	status := a.caller.settle(a.ending(o, err))
	a.report(o, status, err)
}

// report emits the outcome o as the attempt's final event, after a note of
// a lease lost meanwhile that the event does not itself report.
func (a *attempt) report(o Outcome, status int, err error) {
	kind := eventKinds[o]
	if o == OutcomeUnrecorded && errors.Is(err, ErrLeaseLost) {
		kind = EventLeaseLost
	}
	if kind != EventLeaseLost {
		a.noteLoss()
	}
	e := a.event(kind, status, err)
	e.Final, e.Ran = true, a.ran && !a.unprotected
	if kind == EventExecuted {
		e.Epoch = a.epoch
	}
	if a.unprotected {
		e.Kind, e.FailedOpen = EventStoreError, true
	}
	a.cfg.emit(a.ctx, e, a.start)
}

// noteLoss notes, once, a lease lost while the work ran.
func (a *attempt) noteLoss() {
	if a.lost != nil && !a.lossNoted {
		a.lossNoted = true
		a.note(EventLeaseLost, 0, a.lost)
	}
}

func (a *attempt) event(kind EventKind, status int, err error) Event {
	route, method := a.caller.describe()
	return Event{Kind: kind, Route: route, Method: method, Key: a.claim.Key, Status: status, Err: err}
}

// note reports an event in addition to the attempt's outcome.
func (a *attempt) note(kind EventKind, status int, err error) {
	a.cfg.emit(a.ctx, a.event(kind, status, err), a.start)
}
