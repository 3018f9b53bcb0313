package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// attempt is one caller's turn at a record: the core that the middleware
// and Do share. It acquires the record (waiting for another holder in wait
// mode), runs the caller's work under the lease with a heartbeat, and
// completes or releases the record, reporting each step as an event. The
// middleware's request and Do's call give it the record's identity and the
// work, and decide what to answer.
type attempt struct {
	store Store
	cfg   *config
	// ctx is the caller's context: its values reach events, logs and store
	// calls; its cancellation ends an acquire or a wait, never the store
	// calls after the work ran.
	ctx   context.Context
	claim AcquireRequest // key, token, fingerprint, lease and TTL of every store call
	key   string         // the caller's key, for Info
	start time.Time
	sent  time.Time // when the last Acquire was sent: the lease counts from it
	ran   bool      // the work started under the lease
	// describe names the route and method of the attempt's events.
	describe func() (route, method string)
}

func (a *attempt) event(kind EventKind, status int, err error) Event {
	route, method := a.describe()
	return Event{Kind: kind, Route: route, Method: method, Key: a.claim.Key, Status: status, Err: err}
}

// note reports an event in addition to the attempt's outcome.
func (a *attempt) note(kind EventKind, status int, err error) {
	a.cfg.emit(a.ctx, a.event(kind, status, err), a.start)
}

// outcome reports e as the attempt's outcome: its final event.
func (a *attempt) outcome(e Event) {
	e.Final, e.Ran = true, a.ran
	a.cfg.emit(a.ctx, e, a.start)
}

// executed reports the outcome of work that ran and whose result is stored.
func (a *attempt) executed(status int, epoch uint64, lost error) {
	a.reportLoss(lost) // nobody took the record over: the completion landed
	e := a.event(EventExecuted, status, nil)
	e.Epoch = epoch
	a.outcome(e)
}

// reportLoss notes a lease lost while the work ran, when the outcome does
// not say so itself.
func (a *attempt) reportLoss(lost error) {
	if lost != nil {
		a.note(EventLeaseLost, 0, lost)
	}
}

// acquire asks the store for the record; in wait mode, it waits for a
// record held by another caller (see wait). An error means nothing was
// acquired: the store failed, or ctx ended.
func (a *attempt) acquire() (Acquisition, error) {
	acq, err := a.send(a.ctx)
	if err == nil && acq.Outcome == InFlight && a.cfg.wait > 0 {
		acq, err = a.wait(acq)
	}
	return acq, err
}

// send calls Acquire, noting when the call was sent.
func (a *attempt) send(ctx context.Context) (Acquisition, error) {
	a.sent = time.Now()
	return a.store.Acquire(ctx, a.claim)
}

// storeContext is the context of the store calls made for the attempt: the
// caller's values without its cancellation, since the work's effect
// happened whether or not the caller stays.
func (a *attempt) storeContext() context.Context { return context.WithoutCancel(a.ctx) }

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
// *slowAcquireError), reports a steal, and on a transactional route begins
// the transaction (the key is released when it cannot: an error wrapping
// errBegin).
func (a *attempt) begin(acq Acquisition) (Tx, error) {
	if took := time.Since(a.sent); a.cfg.lease-took < minLeaseToStart(a.cfg.lease) {
		a.releaseWithin(heartbeat(a.cfg.lease))
		return nil, &slowAcquireError{took: took, lease: a.cfg.lease}
	}
	if acq.Outcome == Stolen {
		e := a.event(EventStolen, 0, nil)
		e.Epoch = acq.Epoch
		a.cfg.emit(a.ctx, e, a.start) // in addition to the outcome
	}
	if !a.cfg.transaction {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(a.storeContext(), heartbeat(a.cfg.lease))
	defer cancel()
	tx, err := a.store.(TxStore).BeginTx(ctx, a.claim.Key, a.claim.Token)
	if err != nil {
		a.releaseWithin(heartbeat(a.cfg.lease))
		return nil, fmt.Errorf("%w: %w", errBegin, err)
	}
	return tx, nil
}

// releaseWithin releases a lease the work never ran under, giving the
// store d, and notes a release that failed.
func (a *attempt) releaseWithin(d time.Duration) {
	ctx, cancel := context.WithTimeout(a.storeContext(), d)
	defer cancel()
	if err := a.release(ctx); err != nil {
		a.note(EventStoreError, 0, fmt.Errorf("idempotency: release: %w", err))
	}
}

// run runs work under the lease taken at epoch, with a context that holds
// the attempt's Info (FromContext) and that the lease cancels, with a cause
// wrapping ErrLeaseLost, when it is lost. It returns the stopped lease and
// the loss, if the lease was lost. When work panics, run releases the key
// (rolling tx back), reports the outcome and re-raises the panic.
func (a *attempt) run(epoch uint64, tx Tx, work func(ctx context.Context)) (*lease, error) {
	info := &Info{Key: a.key, StorageKey: a.claim.Key, Epoch: epoch}
	if tx != nil {
		info.Tx = tx.Handle()
	}
	ctx, cancel := context.WithCancelCause(context.WithValue(a.ctx, infoKey{}, info))
	defer cancel(nil)
	l := &lease{store: a.store, ctx: a.storeContext(), key: a.claim.Key, token: a.claim.Token, length: a.cfg.lease, lose: cancel}
	l.start(a.sent)

	panicked := true
	defer func() {
		if !panicked {
			return
		}
		v := recover()
		lost := a.stopLease(l)
		sctx, cancel := a.afterWork(l)
		defer cancel()
		if tx != nil {
			_ = tx.Rollback(sctx)
		}
		a.releaseAfterWork(sctx, lost)
		if v == nil { // runtime.Goexit: let it go on
			a.outcome(a.event(EventReleased, 0, errors.New("idempotency: handler exited")))
			return
		}
		a.outcome(a.event(EventReleased, 0, fmt.Errorf("idempotency: handler panicked: %v", v)))
		panic(v)
	}()
	a.note(EventStarted, 0, nil)
	a.ran = true
	work(ctx)
	panicked = false
	return l, a.stopLease(l)
}

// afterWork returns the context of the store calls that follow the work
// (complete or release, with their retries): they end at the lease's store
// deadline (see lease.storeDeadline).
func (a *attempt) afterWork(l *lease) (context.Context, context.CancelFunc) {
	return context.WithDeadline(l.ctx, l.storeDeadline())
}

// stopLease stops the heartbeat and returns the loss, if the lease was lost
// (the outcome reports it); a failed extend the lease survived is noted.
func (a *attempt) stopLease(l *lease) error {
	lost, extendErr := l.stop()
	if lost == nil && extendErr != nil {
		a.note(EventStoreError, 0, fmt.Errorf("idempotency: extend: %w", extendErr))
	}
	return lost
}

// save completes the record with resp after the work ran and reports the
// outcome (Executed, LeaseLost or StoreError, with status). It returns the
// completion's error: nil, ErrLeaseLost (another caller took the record
// over), or the store's.
func (a *attempt) save(l *lease, lost error, epoch uint64, resp *Response, status int) error {
	ctx, cancel := a.afterWork(l)
	defer cancel()
	err := a.complete(ctx, resp)
	switch {
	case errors.Is(err, ErrLeaseLost):
		a.outcome(a.event(EventLeaseLost, status, err))
	case err != nil:
		a.reportLoss(lost)
		a.outcome(a.event(EventStoreError, status, fmt.Errorf("idempotency: complete: %w", err)))
	default:
		a.executed(status, epoch, lost)
	}
	return err
}

// discard releases the record after the work ran, rolling tx back first
// when there is one, and reports the outcome as Released with status and
// err (nil for an ordinary release: a release status, a failed call).
func (a *attempt) discard(l *lease, lost error, tx Tx, status int, err error) {
	a.abandon(l, lost, tx)
	a.outcome(a.event(EventReleased, status, err))
}

// abandon rolls tx back, when there is one, and releases the record after
// the work ran, without reporting an outcome.
func (a *attempt) abandon(l *lease, lost error, tx Tx) {
	ctx, cancel := a.afterWork(l)
	defer cancel()
	if tx != nil {
		_ = tx.Rollback(ctx)
	}
	a.releaseAfterWork(ctx, lost)
}

// commit completes the record with resp in tx, the work's transaction, and
// commits. It returns nil when both landed, ErrLeaseLost when another
// caller took the record over (everything rolled back), and any other
// error when the commit's outcome is unknown (rolled back and released in
// case nothing landed). It reports no outcome: the caller reports it (with
// executed, once the commit landed), with its answer.
func (a *attempt) commit(l *lease, lost error, tx Tx, resp *Response) error {
	ctx, cancel := a.afterWork(l)
	defer cancel()
	err := tx.Complete(ctx, resp, a.cfg.ttl)
	switch {
	case err == nil:
	case errors.Is(err, ErrLeaseLost):
		_ = tx.Rollback(ctx)
	default:
		// Either both the work's writes and the record landed, or neither
		// did: a release frees the key only in the second case.
		_ = tx.Rollback(ctx)
		a.releaseAfterWork(ctx, lost)
	}
	return err
}

// releaseAfterWork releases the key after the work ran, reporting a lease
// lost meanwhile and a release that failed.
func (a *attempt) releaseAfterWork(ctx context.Context, lost error) {
	a.reportLoss(lost)
	err := a.release(ctx)
	switch {
	case err == nil:
	case errors.Is(err, ErrLeaseLost):
		if lost == nil {
			a.note(EventLeaseLost, 0, err)
		}
	default:
		a.note(EventStoreError, 0, fmt.Errorf("idempotency: release: %w", err))
	}
}

// completeAttempts bounds the attempts of a Complete whose outcome is
// unknown (a store error); each presents the same lease, and all of them end
// at the lease's store deadline (see lease.storeDeadline).
const completeAttempts = 3

// complete stores resp, retrying a Complete whose outcome is unknown (a
// store error) with the same lease until ctx ends.
func (a *attempt) complete(ctx context.Context, resp *Response) error {
	var err error
	for i := range completeAttempts {
		if i > 0 {
			select {
			case <-time.After(time.Duration(i) * 20 * time.Millisecond):
			case <-ctx.Done():
				return err
			}
		}
		err = a.store.Complete(ctx, a.claim.Key, a.claim.Token, resp, a.cfg.ttl)
		if err == nil || errors.Is(err, ErrLeaseLost) || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// release releases the key.
func (a *attempt) release(ctx context.Context) error {
	return a.store.Release(ctx, a.claim.Key, a.claim.Token)
}
