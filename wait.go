package idempotency

import (
	"context"
	"time"
)

// minRecheck is the shortest time a waiter waits before it re-checks a
// record on its own: a store that reports a lease about to end again and
// again (a skewed clock, a corrupt record) is not polled in a loop.
const minRecheck = 25 * time.Millisecond

// wait is wait mode: it waits for the record held by another caller to be
// completed or released, re-checking on every notification and, as a
// fallback, when the holder's lease runs out. Every store call it makes is
// bounded by the wait bound, so a store that stops answering (a frozen
// node holding the subscription) cannot hold the waiter past it. It
// returns the last acquisition, which is still InFlight when the wait bound
// passed; with WaitForHolder, only the caller's context ends the wait.
func (a *attempt) wait(acq Acquisition) (Acquisition, error) {
	ctx, cancel := context.WithCancel(a.ctx)
	if a.waitFor < WaitForHolder {
		ctx, cancel = context.WithTimeout(a.ctx, a.waitFor)
	}
	defer cancel()
	recheck := time.NewTimer(max(acq.LeaseRemaining, minRecheck))
	defer recheck.Stop()
	for {
		changed, stop, err := a.store.Watch(ctx, a.claim.Key)
		if err != nil {
			// Without notifications, fall back to re-checking when the
			// holder's lease runs out.
			changed, stop = nil, func() {}
		}
		next, err := a.send(ctx)
		if err != nil && ctx.Err() != nil && a.ctx.Err() == nil {
			stop()
			return acq, nil // the bound passed: the last answer stands
		}
		if err != nil || next.Outcome != InFlight {
			stop()
			return next, err
		}
		acq = next
		recheck.Reset(max(acq.LeaseRemaining, minRecheck))
		select {
		case <-changed:
		case <-recheck.C:
		case <-ctx.Done():
			stop()
			if err := context.Cause(a.ctx); err != nil {
				return acq, err
			}
			return acq, nil
		}
		stop()
	}
}
