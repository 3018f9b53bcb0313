package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// The edges an operator (idemctl outbox) or an application takes. Those
// that take a Selector act on the selected messages in the edge's states
// and leave the others as they are; to act on named messages all or
// nothing, lock them first in a transaction (Lookup), check their states
// against the edge (Edge.Allows), and run the edge in that transaction.

// suspendSQL suspends the selected messages ($1 to $5, see selectorSQL)
// with the reason $6. A claimed one loses its token, so that its relay's
// marks change nothing.
const suspendSQL = `
UPDATE {{.T}} AS o SET
	status = {{lit .Suspended}}, suspended_reason = {{p 6 "text"}}, claim_token = NULL, claim_until = NULL
WHERE o.status IN {{in .From}} AND {{template "selector"}}
RETURNING id, storage_key, seq, status`

// Suspend is the suspend edge: it holds the selected messages that are
// scheduled, ready, waiting for a retry or claimed, suspended with reason
// until Resume. A claimed one loses its claim: its relay's marks are
// refused and its sink's context is cancelled at the relay's next extend.
// Suspension counts no attempt. A suspended message holds the later
// messages of its ordering key back.
func (t *Table) Suspend(ctx context.Context, db DB, sel Selector, reason string) ([]Changed, error) {
	return t.operate(ctx, db, "suspend", t.sql.suspend, sel, Text(reason))
}

// resumeSQL resumes the selected suspended messages ($1 to $5): ready and
// due now, or scheduled when their due_at is later.
const resumeSQL = `
UPDATE {{.T}} AS o SET
	status = CASE WHEN o.due_at > clock.t THEN {{lit .Scheduled}} ELSE {{lit .Ready}} END,
	due_at = CASE WHEN o.due_at > clock.t THEN o.due_at ELSE clock.t END,
	suspended_reason = NULL
FROM {{template "clock"}}
WHERE o.status IN {{in .From}} AND {{template "selector"}}
RETURNING id, storage_key, seq, status`

// Resume is the resume edge: the selected suspended messages are ready
// and due now, or scheduled when their due_at (a schedule, a retry's
// backoff) is later.
func (t *Table) Resume(ctx context.Context, db DB, sel Selector) ([]Changed, error) {
	return t.operate(ctx, db, "resume", t.sql.resume, sel)
}

// scheduleSQL sets the due_at of the selected messages ($1 to $5) to $6,
// or to the server's clock plus $7 when $6 is NULL: scheduled, or ready
// when that time has come.
const scheduleSQL = `
UPDATE {{.T}} AS o SET
	due_at = coalesce({{p 6 "timestamptz"}}, {{shift "clock.t" 7 1}}),
	status = CASE WHEN coalesce({{p 6 "timestamptz"}}, {{shift "clock.t" 7 1}}) > clock.t
		THEN {{lit .Scheduled}} ELSE {{lit .Ready}} END
FROM {{template "clock"}}
WHERE o.status IN {{in .From}} AND {{template "selector"}}
RETURNING id, storage_key, seq, status`

// When is the time Schedule makes messages due: At, or when At is zero,
// In after the database's clock.
type When struct {
	At time.Time
	In time.Duration
}

// Schedule is the schedule edge: the messages ids that are scheduled,
// ready or waiting for a retry fall due at when: scheduled until then, or
// ready when that time has come.
func (t *Table) Schedule(ctx context.Context, db DB, ids []string, when When) ([]Changed, error) {
	var at *time.Time
	if !when.At.IsZero() {
		at = &when.At
	}
	return t.operate(ctx, db, "schedule", t.sql.schedule, Selector{IDs: ids}, at, when.In)
}

// cancelSQL cancels the selected messages ($1 to $5) that are not
// finished, with last_error $6. A claimed one loses its token.
const cancelSQL = `
UPDATE {{.T}} AS o SET
	status = {{lit .Canceled}}, finished_at = clock.t, last_error = {{p 6 "text"}},
	claim_token = NULL, claim_until = NULL
FROM {{template "clock"}}
WHERE o.status IN {{in .From}} AND {{template "selector"}}
RETURNING id, storage_key, seq, status`

// Cancel is the cancel edge: the messages ids that are not finished are
// canceled, with last_error "canceled: <reason>", and returned; those
// finished or unknown are left alone. A claimed one loses its claim: its
// relay's done mark is refused and its sink's context is cancelled at the
// relay's next extend. Run in a transaction, the cancel commits with it.
func (t *Table) Cancel(ctx context.Context, db DB, ids []string, reason string) ([]Changed, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	return t.operate(ctx, db, "cancel", t.sql.cancel, Selector{IDs: ids}, ErrorText(CodeCanceled, errors.New(reason)))
}

// requeueSQL makes the selected finished messages ($1 to $5) of the states
// $6 ready again, due now, their attempts reset, the requeue recorded as
// by $7. last_error and claimed_by stay, saying why and where the message
// last failed, until the next attempt overwrites them.
const requeueSQL = `
UPDATE {{.T}} AS o SET
	status = {{lit .Ready}}, attempts = 0, due_at = clock.t, finished_at = NULL,
	claim_token = NULL, claim_until = NULL,
	requeues = o.requeues + 1, requeued_at = clock.t, requeued_by = {{p 7 "text"}}
FROM {{template "clock"}}
WHERE o.status IN {{in .From}} AND {{inList "o.status" 6 "text"}} AND {{template "selector"}}
RETURNING id, storage_key, seq, status`

// Requeue is the requeue edge: the selected messages in states (done,
// dead or canceled; all three when states is empty) are ready again, due
// now, their attempts reset to 0, the requeue recorded (requeues counted,
// requeued_at, requeued_by = by). A requeued message is presented before
// the later messages of its ordering key not finished yet (they wait for
// it), but after those already finished.
func (t *Table) Requeue(ctx context.Context, db DB, sel Selector, states []State, by string) ([]Changed, error) {
	list, err := t.finished("requeue", states)
	if err != nil {
		return nil, err
	}
	return t.operate(ctx, db, "requeue", t.sql.requeue, sel, list, Text(by))
}

// purgeSQL deletes at most $8 of the selected finished messages ($1 to
// $5) of the states $6 that finished at least $7 ago, the oldest first;
// never one not finished. SKIP LOCKED leaves the rows another purge holds.
const purgeSQL = `
DELETE FROM {{.T}}
WHERE status IN {{in .From}} AND id IN (
	SELECT o.id FROM {{.T}} o
	WHERE o.status IN {{in .From}} AND {{inList "o.status" 6 "text"}}
		AND o.finished_at <= {{shift (now) 7 -1}} AND {{template "selector"}}
	ORDER BY o.finished_at
	LIMIT {{p 8 "integer"}}
	{{skipLocked "o"}})
RETURNING id, storage_key, seq`

// PurgeFilter selects what Purge deletes.
type PurgeFilter struct {
	Selector
	// States are the finished states to purge (all three when empty).
	States []State
	// Older is how long ago a message must have finished.
	Older time.Duration
	// Limit bounds the messages deleted (a batch).
	Limit int
}

// Purge is the purge edge: it deletes up to f.Limit of the selected
// finished messages of f.States that finished at least f.Older ago, the
// oldest first, and returns them.
func (t *Table) Purge(ctx context.Context, db DB, f PurgeFilter) ([]Changed, error) {
	list, err := t.finished("purge", f.States)
	if err != nil {
		return nil, err
	}
	if f.Limit < 1 {
		return nil, fmt.Errorf("lifecycle: purge: a limit of %d", f.Limit)
	}
	args, err := f.Selector.args(t.dialect)
	if err != nil {
		return nil, fmt.Errorf("lifecycle: purge: %w", err)
	}
	rows, err := db.Query(ctx, t.sql.purge, append(args, list, f.Older, f.Limit)...)
	if err == nil {
		var got []Changed
		if got, err = collectChanged(rows, false); err == nil {
			return got, nil
		}
	}
	return nil, fmt.Errorf("lifecycle: purge: %w", err)
}

// finished returns states, checked to be finished ones, as a list
// parameter: all three when it is empty.
func (t *Table) finished(edge string, states []State) (any, error) {
	if len(states) == 0 {
		states = terminal
	}
	list := make([]string, len(states))
	for i, s := range states {
		if !s.IsTerminal() {
			return nil, fmt.Errorf("lifecycle: %s: %q is not a finished state", edge, s)
		}
		list[i] = string(s)
	}
	return t.dialect.List(list), nil
}

// operate runs an operator's edge on the messages sel selects.
func (t *Table) operate(ctx context.Context, db DB, edge, sql string, sel Selector, more ...any) ([]Changed, error) {
	args, err := sel.args(t.dialect)
	if err != nil {
		return nil, fmt.Errorf("lifecycle: %s: %w", edge, err)
	}
	rows, err := db.Query(ctx, sql, append(args, more...)...)
	if err == nil {
		var got []Changed
		if got, err = collectChanged(rows, true); err == nil {
			return got, nil
		}
	}
	return nil, fmt.Errorf("lifecycle: %s: %w", edge, err)
}
