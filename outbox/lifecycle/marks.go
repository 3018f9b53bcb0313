package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// The relay's marks. Each is fenced: it changes a row only while it is
// claimed under the token of the claim that presented it. A claim that ran
// out and was taken back (reclaim) has no token any more, nor has a
// message an operator suspended or canceled, and a new claim has another
// token: the first relay's marks change nothing. An UPDATE under READ
// COMMITTED judges the row's latest version under its lock, so a mark and
// a reclaim (or an operator's edge) of one row are ordered by that lock,
// and whichever comes second finds the row changed.

// extendSQL pushes the claim of the messages $2 held under the token $1
// to the server's clock plus $3, and returns those it held.
const extendSQL = `
UPDATE {{.T}} SET claim_until = {{shift (now) 3 1}}
WHERE {{inList "id" 2 "bigint"}} AND status IN {{in .From}} AND claim_token = {{p 1 "text"}}
RETURNING id`

// Extend is the extend edge: it pushes the claim of the messages ids held
// under token to the database's clock plus lease, and returns the ids it
// still held. An id it does not return is no longer claimed under the
// token: canceled, suspended, or taken back after its claim ran out.
func (t *Table) Extend(ctx context.Context, db DB, token string, ids []int64, lease time.Duration) ([]int64, error) {
	return t.markIDs(ctx, db, "extend", t.sql.extend, token, ids, lease)
}

// releaseSQL hands back the messages $2 of the claim with token $1 that
// were never presented: ready again, due as they were, no attempt
// counted.
const releaseSQL = `
UPDATE {{.T}} SET status = {{lit .Ready}}, claim_token = NULL, claim_until = NULL
WHERE {{inList "id" 2 "bigint"}} AND status IN {{in .From}} AND claim_token = {{p 1 "text"}}
RETURNING id`

// Release is the release edge: it hands back the messages ids of the
// claim with token that were not presented (the relay stops, or too
// little of the lease was left), ready again and due as they were, and
// returns the ids it released.
func (t *Table) Release(ctx context.Context, db DB, token string, ids []int64) ([]int64, error) {
	return t.markIDs(ctx, db, "release", t.sql.release, token, ids)
}

// doneSQL marks the messages $2 of the claim with token $1 done, their
// attempt counted, and returns the ids it marked.
const doneSQL = `
UPDATE {{.T}} SET
	status = {{lit .Done}}, attempts = attempts + 1, finished_at = {{now}},
	claim_token = NULL, claim_until = NULL
WHERE {{inList "id" 2 "bigint"}} AND status IN {{in .From}} AND claim_token = {{p 1 "text"}}
RETURNING id`

// Done is the done edge: it marks the messages ids of the claim with
// token done, each with its attempt counted, in one statement, and returns
// the ids it marked. An id it does not return was no longer claimed under
// the token. Run in the transaction of a message's own work, it commits
// with that work, or not at all.
func (t *Table) Done(ctx context.Context, db DB, token string, ids []int64) ([]int64, error) {
	return t.markIDs(ctx, db, "done", t.sql.done, token, ids)
}

// markIDs runs a mark of several ids that returns the ids it changed.
func (t *Table) markIDs(ctx context.Context, db DB, edge, sql, token string, ids []int64, more ...any) ([]int64, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := db.Query(ctx, sql, append([]any{token, t.dialect.List(ids)}, more...)...)
	if err == nil {
		var got []int64
		if got, err = Collect(rows, scanOne[int64]); err == nil {
			return got, nil
		}
	}
	return nil, fmt.Errorf("lifecycle: %s %d messages: %w", edge, len(ids), err)
}

// Mark is what a relay's mark of one message left.
type Mark struct {
	// State is the message's new state.
	State State
	// Attempts counts its presentations, this one included when the edge
	// counts it.
	Attempts int
}

// retrySQL records a failed presentation of the message $2 claimed under
// $1: waiting for a retry, due after the backoff $4, or dead when this was
// attempt $3 (the cap) or later; the error $5 is kept either way.
const retrySQL = `
UPDATE {{.T}} AS o SET
	attempts = o.attempts + 1,
	status = CASE WHEN o.attempts + 1 >= {{p 3 "integer"}} THEN {{lit .Dead}} ELSE {{lit .RetryWait}} END,
	due_at = {{shift "clock.t" 4 1}},
	finished_at = CASE WHEN o.attempts + 1 >= {{p 3 "integer"}} THEN clock.t END,
	last_error = {{p 5 "text"}},
	claim_token = NULL, claim_until = NULL
FROM {{template "clock"}}
WHERE o.id = {{p 2 "bigint"}} AND o.status IN {{in .From}} AND o.claim_token = {{p 1 "text"}}
RETURNING status, attempts`

// Retry is the retry edge: the presentation of the message id claimed
// under token failed with lastError ("<code>: <message>", kept as Text
// keeps it). The message waits for a retry, due after backoff, or is dead
// when this was attempt maxAttempts or later. The error wraps
// ErrNotClaimed when the message was no longer claimed under token.
func (t *Table) Retry(ctx context.Context, db DB, token string, id int64, maxAttempts int, backoff time.Duration, lastError string) (Mark, error) {
	return t.markOne(ctx, db, "retry", t.sql.retry, token, id, maxAttempts, backoff, Text(lastError))
}

// refuseSQL records the sink's permanent refusal of the message $2
// claimed under $1: dead at once, with the reason $3.
const refuseSQL = `
UPDATE {{.T}} AS o SET
	status = {{lit .Dead}}, attempts = o.attempts + 1, finished_at = {{now}},
	last_error = {{p 3 "text"}}, claim_token = NULL, claim_until = NULL
WHERE o.id = {{p 2 "bigint"}} AND o.status IN {{in .From}} AND o.claim_token = {{p 1 "text"}}
RETURNING status, attempts`

// Refuse is the refuse edge: the sink refused the message id claimed
// under token permanently (outbox.Permanent), with reason, which becomes
// its last_error; the message is dead at once, its attempt counted. The
// error wraps ErrNotClaimed when the message was no longer claimed under
// token.
func (t *Table) Refuse(ctx context.Context, db DB, token string, id int64, reason string) (Mark, error) {
	return t.markOne(ctx, db, "refuse", t.sql.refuse, token, id, Text(reason))
}

// unreadableSQL sets apart the message $2 claimed under $1 whose row the
// relay could not read: dead at once, with the decode error $3.
const unreadableSQL = `
UPDATE {{.T}} AS o SET
	status = {{lit .Dead}}, attempts = o.attempts + 1, finished_at = {{now}},
	last_error = {{p 3 "text"}}, claim_token = NULL, claim_until = NULL
WHERE o.id = {{p 2 "bigint"}} AND o.status IN {{in .From}} AND o.claim_token = {{p 1 "text"}}
RETURNING status, attempts`

// Unreadable is the unreadable edge: the relay could not read the row of
// the message id claimed under token (ClaimedMessage.Err); the message is dead
// at once, its attempt counted, with last_error "unreadable: <err>". The
// error wraps ErrNotClaimed when the message was no longer claimed under
// token.
func (t *Table) Unreadable(ctx context.Context, db DB, token string, id int64, err error) (Mark, error) {
	return t.markOne(ctx, db, "unreadable", t.sql.unreadable, token, id, ErrorText(CodeUnreadable, err))
}

// sinkSuspendSQL suspends the message $2 claimed under $1 at its sink's
// request, with the reason $3; the attempt is not counted.
const sinkSuspendSQL = `
UPDATE {{.T}} AS o SET
	status = {{lit .Suspended}}, suspended_reason = {{p 3 "text"}}, claim_token = NULL, claim_until = NULL
WHERE o.id = {{p 2 "bigint"}} AND o.status IN {{in .From}} AND o.claim_token = {{p 1 "text"}}
RETURNING status, attempts`

// SinkSuspend is the sink-suspend edge: the sink asked that the message
// id claimed under token wait (outbox.Suspend: a budget exhausted, a
// downstream closed); the message is suspended with reason until an
// operator resumes it, and the presentation does not count as an attempt.
// The error wraps ErrNotClaimed when the message was no longer claimed
// under token.
func (t *Table) SinkSuspend(ctx context.Context, db DB, token string, id int64, reason string) (Mark, error) {
	return t.markOne(ctx, db, "sink-suspend", t.sql.sinkSuspend, token, id, Text(reason))
}

// markOne runs a mark of one message that returns its state and attempts.
func (t *Table) markOne(ctx context.Context, db DB, edge, sql, token string, id int64, more ...any) (Mark, error) {
	var m Mark
	var attempts int32
	err := QueryRow(ctx, db, sql, append([]any{token, id}, more...), &m.State, &attempts)
	m.Attempts = int(attempts)
	switch {
	case errors.Is(err, ErrNoRows):
		return Mark{}, fmt.Errorf("lifecycle: %s row %d: %w", edge, id, ErrNotClaimed)
	case err != nil:
		return Mark{}, fmt.Errorf("lifecycle: %s row %d: %w", edge, id, err)
	}
	return m, nil
}

// reclaimSQL takes back the claims whose lease ran out before their relay
// marked an outcome (it died, stalled, or lost the database): each counts
// as an attempt (the message may have been published), so a message that
// kills every relay that presents it goes dead at the cap ($1) instead of
// looping. The others wait for a retry, due at once.
const reclaimSQL = `
UPDATE {{.T}} AS o SET
	attempts = o.attempts + 1,
	status = CASE WHEN o.attempts + 1 >= {{p 1 "integer"}} THEN {{lit .Dead}} ELSE {{lit .RetryWait}} END,
	due_at = clock.t,
	finished_at = CASE WHEN o.attempts + 1 >= {{p 1 "integer"}} THEN clock.t END,
	last_error = {{lit .ClaimExpired}} || ': the claim of ' || coalesce(o.claimed_by, 'a relay') || ' ran out before it marked an outcome',
	claim_token = NULL, claim_until = NULL
FROM {{template "clock"}}
WHERE o.status IN {{in .From}} AND o.claim_until <= clock.t
RETURNING id, storage_key, seq, status, topic, attempts`

// Reclaimed is a message whose claim ran out, as Reclaim took it back.
type Reclaimed struct {
	Changed
	Topic    string
	Attempts int
}

// Reclaim is the reclaim edge: it takes back every claim that ran out on
// the database's clock (each counts an attempt), waiting for a retry due
// at once, or dead when that was attempt maxAttempts or later, with
// last_error "claim_expired: ...".
func (t *Table) Reclaim(ctx context.Context, db DB, maxAttempts int) ([]Reclaimed, error) {
	rows, err := db.Query(ctx, t.sql.reclaim, maxAttempts)
	if err != nil {
		return nil, fmt.Errorf("lifecycle: reclaim: %w", err)
	}
	got, err := Collect(rows, func(row Rows) (Reclaimed, error) {
		var r Reclaimed
		var key string
		var seq, attempts int32
		err := row.Scan(&r.RowID, &key, &seq, &r.State, &r.Topic, &attempts)
		r.ID, r.Attempts = MessageID(key, int(seq)), int(attempts)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("lifecycle: reclaim: %w", err)
	}
	return got, nil
}
