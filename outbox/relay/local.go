package relay

import (
	"context"
	"errors"

	"github.com/go-idempotency/idempotency/outbox/internal/runclaim"
)

// The local-run hook. A local run (package outbox/local) does a message's
// work in a transaction of the outbox's own database and marks the
// message done in that transaction, fenced by the relay's claim, so that
// the work and the mark commit together. The relay takes part twice:
//
//   - withLocalRun: the sink's context carries the claim (its token, the
//     message's row), which only the relay knows;
//   - ranLocally: the sink's error wrapping runclaim.ErrRan says that the
//     run committed the done mark itself; the relay reports the message
//     as published and marks nothing, where a nil error would have it
//     marked done a second time (a mark its claim, gone with the first,
//     refuses: EventFenced).
//
// Any other error of a local run is settled as any sink's: a retry, a
// refusal, a suspension; a run whose done mark found the claim lost
// returns an error wrapping outbox.ErrClaimLost, whose retry mark the
// claim's loss refuses in turn (EventFenced, or EventCanceled).

// withLocalRun returns the sink's context ctx carrying the claim c, for a
// local run to find its message's claim in.
func withLocalRun(ctx context.Context, c *claim) context.Context {
	return runclaim.With(ctx, c.localRun)
}

// localRun returns the claim on the message of id, and false when the
// claim holds no such message.
func (c *claim) localRun(id string) (runclaim.Claim, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for row, h := range c.held {
		if h.m.env.ID == id {
			return runclaim.Claim{Table: c.r.table, Token: c.token, RowID: row, Marking: func() { c.settle(row) }}, true
		}
	}
	return runclaim.Claim{}, false
}

// ranLocally reports whether the sink's err says that a local run marked
// the message done itself, in its work's transaction.
func ranLocally(err error) bool { return errors.Is(err, runclaim.ErrRan) }
