package lifecycle

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// claimSQL claims up to $1 due messages for a claim with token $2 by relay
// $3, for a lease of $4, and returns them.
//
// A message is due when it is scheduled, ready or waiting for a retry, its
// due_at has passed, and no earlier message (a smaller id) of its ordering
// key is in a state that is not terminal: a key's messages are presented
// one at a time, in id order, and a batch holds at most one of each key. A
// suspended or scheduled earlier message holds the later ones back. The
// check reads the statement's snapshot; it can only find a message not
// finished that has finished since (a key then waits for the next claim),
// never the reverse, except for an operator's requeue.
//
// SKIP LOCKED leaves the rows another relay's claim is locking, and a row
// claimed by another relay after the snapshot is checked again on its
// latest version (no longer claimable), so concurrent claims partition the
// due messages. The lease runs from the server's clock as the claim runs.
// The update finds the rows the sub-select chose by their ids (see
// Dialect.InSelect), however many rows the planner expects of it.
const claimSQL = `
UPDATE {{.T}} SET
	status = {{lit .Claimed}}, claim_token = {{p 2 "text"}}, claimed_by = {{p 3 "text"}},
	claim_until = {{shift (now) 4 1}}
WHERE status IN {{in .From}} AND {{inSelect "id"}}
	SELECT o.id FROM {{.T}} o
	WHERE o.status IN {{in .From}} AND o.due_at <= {{now}}
		AND NOT EXISTS (
			SELECT 1 FROM {{.T}} e
			WHERE e.ordering_key = o.ordering_key AND e.id < o.id AND e.status IN {{in .NonTerminal}})
	ORDER BY o.due_at, o.id
	LIMIT {{p 1 "integer"}}
	{{skipLocked "o"}}{{endInSelect}}
RETURNING id, storage_key, seq, topic, payload, headers, ordering_key, attempts, enqueued_at`

// ClaimedMessage is a message as the claim returned it.
type ClaimedMessage struct {
	// RowID is the message's row (the id column): what the relay's marks
	// name it by.
	RowID int64
	// ID is the message's ID, "" when the row's storage key or sequence
	// could not be read.
	ID          string
	Topic       string
	Payload     []byte
	Headers     map[string]string
	OrderingKey string
	// Attempts counts the presentations before this one.
	Attempts   int
	EnqueuedAt time.Time
	// Err, when not nil, says why the row could not be read (its headers
	// are not a JSON object of strings, its time is infinite, a column is
	// NULL...): the message is not presented, and the relay sets it apart
	// with Unreadable. The row's other messages are read on their own.
	Err error
}

// Claim is the claim edge: it claims up to limit due messages for the
// claim token, naming relay in their claimed_by, for a lease of lease on
// the database's clock, and returns them in id order. Each row is read on
// its own: a row that cannot be read comes back with its Err set, and the
// others as they are.
func (t *Table) Claim(ctx context.Context, db DB, token, relay string, lease time.Duration, limit int) ([]ClaimedMessage, error) {
	rows, err := db.Query(ctx, t.sql.claim, limit, token, relay, lease)
	if err != nil {
		return nil, fmt.Errorf("lifecycle: claim: %w", err)
	}
	defer rows.Close()
	var out []ClaimedMessage
	cells, dst := newCells(len(claimColumns))
	for rows.Next() {
		if err := rows.Scan(dst...); err != nil {
			return nil, fmt.Errorf("lifecycle: claim: %w", err)
		}
		c, err := t.decodeClaimed(cells)
		if err != nil { // the row's id itself: nothing to mark it by
			return nil, fmt.Errorf("lifecycle: claim: %w", err)
		}
		out = append(out, c)
	}
	if err := rows.Close(); err != nil {
		return nil, fmt.Errorf("lifecycle: claim: %w", err)
	}
	slices.SortFunc(out, func(a, b ClaimedMessage) int { return cmp.Compare(a.RowID, b.RowID) })
	return out, nil
}

// claimColumns name the columns of the claim's rows, for errors.
var claimColumns = [9]string{"id", "storage_key", "seq", "topic", "payload", "headers", "ordering_key", "attempts", "enqueued_at"}

// decodeClaimed reads one row of the claim from the values its driver
// gave, column by column, so that a value it cannot read makes that row
// unreadable (Err) instead of failing the claim's other rows, as a scan
// of the whole result would. It returns an error only when the row's id
// cannot be read.
func (t *Table) decodeClaimed(cells []cell) (ClaimedMessage, error) {
	var c ClaimedMessage
	col := func(i int, err error) error {
		if err != nil {
			return fmt.Errorf("column %s %w", claimColumns[i], err)
		}
		return nil
	}
	var err error
	if c.RowID, err = integer(cells[0].v, math.MaxInt64); err != nil {
		return c, col(0, err)
	}
	key, kerr := text(cells[1].v)
	seq, serr := integer(cells[2].v, math.MaxInt32)
	if kerr == nil && serr == nil {
		c.ID = MessageID(key, int(seq))
	}
	errs := []error{col(1, kerr), col(2, serr)}
	var headers string
	var attempts int64
	var herr error
	c.Topic, err = text(cells[3].v)
	errs = append(errs, col(3, err))
	c.Payload, err = blob(cells[4].v)
	errs = append(errs, col(4, err))
	headers, herr = text(cells[5].v)
	errs = append(errs, col(5, herr))
	c.OrderingKey, err = text(cells[6].v)
	errs = append(errs, col(6, err))
	attempts, err = integer(cells[7].v, math.MaxInt32)
	errs = append(errs, col(7, err))
	c.EnqueuedAt, err = t.dialect.time(cells[8].v)
	errs = append(errs, col(8, err))
	if herr == nil {
		errs = append(errs, decodeHeaders(headers, &c.Headers))
	}
	c.Attempts = int(attempts)
	if err := errors.Join(errs...); err != nil {
		c.Err = fmt.Errorf("row %d: %w", c.RowID, err)
	}
	return c, nil
}

// integer reads a driver's integer of at most limit.
func integer(v any, limit int64) (int64, error) {
	n, ok := v.(int64)
	if !ok {
		return 0, errNotA("integer", v)
	}
	if n > limit || n < -limit-1 {
		return 0, fmt.Errorf("is out of range: %d", n)
	}
	return n, nil
}

// text reads a driver's text.
func text(v any) (string, error) {
	switch v := v.(type) {
	case string:
		return v, nil
	case []byte:
		return string(v), nil
	}
	return "", errNotA("text", v)
}

// blob reads a driver's bytes: empty ones as an empty slice, not nil,
// whatever the driver gives for them.
func blob(v any) ([]byte, error) {
	switch v := v.(type) {
	case []byte:
		if v == nil {
			return []byte{}, nil
		}
		return v, nil
	case string:
		return []byte(v), nil
	}
	return nil, errNotA("bytes", v)
}

// decodeHeaders decodes the headers column's JSON text into h: an object
// of strings, and nothing else (not JSON null, an array, numbers).
func decodeHeaders(text string, h *map[string]string) error {
	if text == "{}" { // most messages have none: no decoder for them
		*h = map[string]string{}
		return nil
	}
	if err := json.Unmarshal([]byte(text), h); err != nil {
		return fmt.Errorf("column headers is not a JSON object of strings: %w", err)
	}
	if *h == nil {
		return fmt.Errorf("column headers is not a JSON object of strings: %s", text)
	}
	return nil
}
