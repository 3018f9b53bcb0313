package outbox

import (
	"context"
	"fmt"
)

// Cancel cancels the messages ids that are not finished yet, in the
// transaction of the transactional route or call whose context ctx is (as
// Enqueue writes in it): the cancel commits with its record and its other
// writes, or not at all. It returns the IDs it canceled; those already
// finished (done, dead or canceled) or not in the table are left alone.
// A canceled message is never presented again: one that a relay is
// presenting has its sink's context cancelled at the relay's next extend
// of its claim, and its done mark refused. Its last_error reads
// "canceled: by outbox.Cancel". An operator cancels from outside a
// transaction with idemctl outbox cancel, or with lifecycle.Table's
// Cancel on a pool.
//
// Outside a transactional route the error wraps ErrNoTransaction; an ID
// that is not one wraps ErrInvalidID. Any other error is the database's,
// and aborts the transaction.
func Cancel(ctx context.Context, ids ...string) ([]string, error) {
	_, tx, table, err := transaction(ctx)
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		if _, _, err := ParseID(id); err != nil {
			return nil, err
		}
	}
	changed, err := table.Cancel(ctx, tx, ids, "by outbox.Cancel")
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	// A canceled message no longer holds the later messages of its
	// ordering key back: wake the relays when the transaction commits.
	if len(changed) > 0 {
		if err := table.Notify(ctx, tx); err != nil {
			return nil, fmt.Errorf("outbox: %w", err)
		}
	}
	out := make([]string, len(changed))
	for i, c := range changed {
		out[i] = c.ID
	}
	return out, nil
}
