package idempotency

import (
	"context"
	"time"
)

// minRecheck is the shortest time a waiter waits before it re-checks a
// record on its own: a store that reports a lease about to end again and
// again (a skewed clock, a corrupt record) is not polled in a loop.
const minRecheck = 25 * time.Millisecond

// wait is wait mode: it waits for the record held by another request to be
// completed or released, re-checking on every notification and, as a
// fallback, when the holder's lease runs out. It returns the last
// acquisition, which is still InFlight when the wait bound passed.
func (rq *request) wait(acq Acquisition) (Acquisition, error) {
	ctx := rq.r.Context()
	deadline := time.NewTimer(rq.h.cfg.wait)
	defer deadline.Stop()
	recheck := time.NewTimer(max(acq.LeaseRemaining, minRecheck))
	defer recheck.Stop()
	for {
		changed, stop, err := rq.h.store.Watch(ctx, rq.acq.Key)
		if err != nil {
			// Without notifications, fall back to re-checking when the
			// holder's lease runs out.
			changed, stop = nil, func() {}
		}
		acq, err = rq.acquire(ctx)
		if err != nil || acq.Outcome != InFlight {
			stop()
			return acq, err
		}
		recheck.Reset(max(acq.LeaseRemaining, minRecheck))
		select {
		case <-changed:
		case <-recheck.C:
		case <-deadline.C:
			stop()
			return acq, nil
		case <-ctx.Done():
			stop()
			return acq, context.Cause(ctx)
		}
		stop()
	}
}
