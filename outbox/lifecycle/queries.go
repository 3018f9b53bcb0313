package lifecycle

import (
	"context"
	"fmt"
	"math"
	"time"
)

// The read-only queries: the relay's idle state, and what idemctl shows.

// relayStateSQL reads, in seconds from the server's clock: the lag (how
// long the earliest due message has been due, 0 when none is), the time
// until the next message not yet due falls due, and until the next claim
// runs out (NULL when there is none).
const relayStateSQL = `
{{- $due := printf "(SELECT min(due_at) FROM %s WHERE status IN %s AND due_at <= clock.t)" .T (in .Claimable) -}}
{{- $next := printf "(SELECT min(due_at) FROM %s WHERE status IN %s AND due_at > clock.t)" .T (in .Claimable) -}}
{{- $expiry := printf "(SELECT min(claim_until) FROM %s WHERE status = %s)" .T (lit .Claimed) }}
SELECT coalesce({{seconds $due "clock.t"}}, 0), {{seconds "clock.t" $next}}, {{seconds "clock.t" $expiry}}
FROM {{template "clock"}}`

// RelayState is what a relay's idle loop reads.
type RelayState struct {
	// Lag is how long the earliest due message has been due (0 when none
	// is). A due message may wait for an earlier one of its ordering key.
	Lag time.Duration
	// NextDue is the time until the next message not yet due falls due
	// (a schedule, a retry's backoff), 0 when none is waiting.
	NextDue time.Duration
	// NextExpiry is the time until the next claim runs out, 0 when no
	// message is claimed.
	NextExpiry time.Duration
}

// RelayState reads the relay's idle state: the lag, and how long until
// something falls due.
func (t *Table) RelayState(ctx context.Context, db DB) (RelayState, error) {
	var lag float64
	var nextDue, nextExpiry *float64
	if err := QueryRow(ctx, db, t.sql.relayState, nil, &lag, &nextDue, &nextExpiry); err != nil {
		return RelayState{}, fmt.Errorf("lifecycle: relay state: %w", err)
	}
	s := RelayState{Lag: seconds(lag)}
	if nextDue != nil {
		s.NextDue = max(seconds(*nextDue), time.Nanosecond)
	}
	if nextExpiry != nil {
		s.NextExpiry = max(seconds(*nextExpiry), time.Nanosecond)
	}
	return s, nil
}

// seconds converts a number of seconds to a Duration.
func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// clockNowSQL reads the server's clock.
const clockNowSQL = `SELECT {{now}}`

// countsSQL counts the messages by state at $1 (the server's clock): all,
// those due (due_at passed), whose claim ran out, and that were requeued.
const countsSQL = `
SELECT status, count(*),
	sum(CASE WHEN due_at <= {{p 1 "timestamptz"}} THEN 1 ELSE 0 END),
	sum(CASE WHEN claim_until <= {{p 1 "timestamptz"}} THEN 1 ELSE 0 END),
	sum(CASE WHEN requeues > 0 THEN 1 ELSE 0 END)
FROM {{.T}}
GROUP BY status`

// oldestSQL reads the earliest due message at $1.
const oldestSQL = `
SELECT storage_key, seq, status, topic, attempts, enqueued_at, due_at
FROM {{.T}}
WHERE status IN {{in .Claimable}} AND due_at <= {{p 1 "timestamptz"}}
ORDER BY due_at, id
LIMIT 1`

// errorsSQL groups the last errors of the messages in the state $1 by
// text, each message's own ID in it as <id>, and returns the $2 groups of
// the latest messages, with the ID of each group's latest, and the number
// of groups and messages in all.
const errorsSQL = `
SELECT g.error, g.n, l.storage_key, l.seq, count(*) OVER (), sum(g.n) OVER ()
FROM (
	SELECT replace(last_error, storage_key || '/' || seq, '<id>') AS error, count(*) AS n, max(id) AS latest
	FROM {{.T}}
	WHERE status = {{p 1 "text"}} AND last_error IS NOT NULL
	GROUP BY 1
) g JOIN {{.T}} l ON l.id = g.latest
ORDER BY g.latest DESC
LIMIT {{p 2 "integer"}}`

// relaysSQL counts the claimed messages by relay, and those whose claim
// ran out at $1.
const relaysSQL = `
SELECT coalesce(claimed_by, ''), count(*), sum(CASE WHEN claim_until <= {{p 1 "timestamptz"}} THEN 1 ELSE 0 END)
FROM {{.T}}
WHERE status = {{lit .Claimed}}
GROUP BY 1
ORDER BY 1`

// suspendedSQL counts the suspended messages by reason.
const suspendedSQL = `
SELECT coalesce(suspended_reason, ''), count(*)
FROM {{.T}}
WHERE status = {{lit .Suspended}}
GROUP BY 1
ORDER BY 2 DESC, 1`

// Status is what idemctl outbox status shows.
type Status struct {
	// Now is the server's clock, at which the counts were taken.
	Now time.Time
	// Counts has every state, 0 when no message is in it.
	Counts map[State]int64
	// Due counts the messages of each claimable state whose due_at has
	// passed.
	Due map[State]int64
	// RanOut counts the claimed messages whose claim ran out.
	RanOut int64
	// Requeued counts the messages an operator requeued at least once.
	Requeued int64
	Total    int64
	// Oldest is the earliest due message, nil when none is due.
	Oldest *Oldest
	// Errors are the last errors of the messages waiting for a retry
	// (RetryWait) and of the dead ones (Dead), grouped.
	Errors map[State]ErrorGroups
	// Relays are the relays holding claims, by name.
	Relays []RelayClaims
	// Suspended counts the suspended messages by reason.
	Suspended []Reason
}

// Oldest is the message that has been due the longest.
type Oldest struct {
	ID         string
	State      State
	Topic      string
	Attempts   int
	EnqueuedAt time.Time
	DueAt      time.Time
}

// ErrorGroups are the last errors of the messages in one state, grouped
// by text (a message's own ID in it as <id>), the group of the latest
// message first: at most the groups asked for, of Groups groups and
// Messages messages in all.
type ErrorGroups struct {
	Shown    []ErrorGroup
	Groups   int64
	Messages int64
}

// ErrorGroup are the messages whose last error is Error.
type ErrorGroup struct {
	Error    string
	Messages int64
	// LatestID is the group's latest message.
	LatestID string
}

// RelayClaims are the claimed messages of one relay.
type RelayClaims struct {
	Relay   string // claimed_by; "" when not set
	Claimed int64
	RanOut  int64
}

// Reason are the messages suspended for one reason.
type Reason struct {
	Reason   string
	Messages int64
}

// Status reads the counts by state, the earliest due message, the last
// errors of the messages waiting for a retry and of the dead ones (at
// most groups of each), the claims by relay and the suspended messages
// by reason, all at one reading of the server's clock. Run it in a
// REPEATABLE READ transaction for one snapshot.
func (t *Table) Status(ctx context.Context, db DB, groups int) (*Status, error) {
	s := &Status{Counts: map[State]int64{}, Due: map[State]int64{}, Errors: map[State]ErrorGroups{}}
	for _, st := range States() {
		s.Counts[st] = 0
	}
	if err := QueryRow(ctx, db, t.sql.clock, nil, &s.Now); err != nil {
		return nil, fmt.Errorf("lifecycle: status: %w", err)
	}
	rows, err := db.Query(ctx, t.sql.counts, s.Now)
	if err != nil {
		return nil, fmt.Errorf("lifecycle: status: %w", err)
	}
	var st State
	var n, due, ranOut, requeued int64
	err = forEach(rows, []any{&st, &n, &due, &ranOut, &requeued}, func() error {
		s.Counts[st] += n
		s.Total += n
		s.Requeued += requeued
		if EdgeClaim.Allows(st) {
			s.Due[st] = due
		}
		if st == Claimed {
			s.RanOut = ranOut
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("lifecycle: status: %w", err)
	}

	var o Oldest
	var key string
	var seq, attempts int32
	err = QueryRow(ctx, db, t.sql.oldest, []any{s.Now}, &key, &seq, &o.State, &o.Topic, &attempts, &o.EnqueuedAt, &o.DueAt)
	switch {
	case err == nil:
		o.ID, o.Attempts = MessageID(key, int(seq)), int(attempts)
		s.Oldest = &o
	case err != ErrNoRows:
		return nil, fmt.Errorf("lifecycle: status: %w", err)
	}

	for _, state := range []State{RetryWait, Dead} {
		rows, err := db.Query(ctx, t.sql.errors, string(state), groups)
		if err != nil {
			return nil, fmt.Errorf("lifecycle: status: %w", err)
		}
		var g ErrorGroups
		var e ErrorGroup
		err = forEach(rows, []any{&e.Error, &e.Messages, &key, &seq, &g.Groups, &g.Messages}, func() error {
			e.LatestID = MessageID(key, int(seq))
			g.Shown = append(g.Shown, e)
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("lifecycle: status: %w", err)
		}
		s.Errors[state] = g
	}

	rows, err = db.Query(ctx, t.sql.relays, s.Now)
	if err != nil {
		return nil, fmt.Errorf("lifecycle: status: %w", err)
	}
	var r RelayClaims
	if err = forEach(rows, []any{&r.Relay, &r.Claimed, &r.RanOut}, func() error {
		s.Relays = append(s.Relays, r)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("lifecycle: status: %w", err)
	}

	rows, err = db.Query(ctx, t.sql.suspended)
	if err != nil {
		return nil, fmt.Errorf("lifecycle: status: %w", err)
	}
	var why Reason
	if err = forEach(rows, []any{&why.Reason, &why.Messages}, func() error {
		s.Suspended = append(s.Suspended, why)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("lifecycle: status: %w", err)
	}
	return s, nil
}

// lookupSQL reads and locks the messages of the storage keys $1 and the
// sequences $2.
const lookupSQL = `
SELECT o.id, o.storage_key, o.seq, o.status, o.claimed_by
FROM {{.T}} o
WHERE {{inPairs "o.storage_key" "o.seq" 1 "text" "integer"}}
{{lock "o"}}`

// Found is a message Lookup found.
type Found struct {
	Changed
	// ClaimedBy is the relay that claimed it last, "" when none did.
	ClaimedBy string
}

// Lookup reads the messages ids and locks their rows until db's
// transaction ends, so that their states stay as read while the caller
// checks them against an edge (Edge.Allows) and runs it. It returns those
// it found, by ID; an ID not in the table is not in the map. It returns an
// error wrapping ErrInvalidID for an ID that is not one.
func (t *Table) Lookup(ctx context.Context, db DB, ids []string) (map[string]Found, error) {
	keys := make([]string, len(ids))
	seqs := make([]int32, len(ids))
	for i, id := range ids {
		key, seq, err := ParseMessageID(id)
		if err != nil {
			return nil, err
		}
		keys[i], seqs[i] = key, int32(seq)
	}
	rows, err := db.Query(ctx, t.sql.lookup, t.dialect.List(keys), t.dialect.List(seqs))
	if err != nil {
		return nil, fmt.Errorf("lifecycle: lookup: %w", err)
	}
	found := map[string]Found{}
	var f Found
	var key string
	var seq int32
	var claimedBy *string
	if err := forEach(rows, []any{&f.RowID, &key, &seq, &f.State, &claimedBy}, func() error {
		f.ID, f.ClaimedBy = MessageID(key, int(seq)), ""
		if claimedBy != nil {
			f.ClaimedBy = *claimedBy
		}
		found[f.ID] = f
		return nil
	}); err != nil {
		return nil, fmt.Errorf("lifecycle: lookup: %w", err)
	}
	return found, nil
}

// statesSQL reads the states of the rows $1.
const statesSQL = `SELECT id, status FROM {{.T}} WHERE {{inList "id" 1 "bigint"}}`

// States returns the state of each of the rows ids still in the table:
// what a relay reads of the messages whose claim it found lost.
func (t *Table) States(ctx context.Context, db DB, ids []int64) (map[int64]State, error) {
	out := map[int64]State{}
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := db.Query(ctx, t.sql.states, t.dialect.List(ids))
	if err != nil {
		return nil, fmt.Errorf("lifecycle: states: %w", err)
	}
	var id int64
	var st State
	if err := forEach(rows, []any{&id, &st}, func() error {
		out[id] = st
		return nil
	}); err != nil {
		return nil, fmt.Errorf("lifecycle: states: %w", err)
	}
	return out, nil
}

// listSQL reads the messages in the state $1 (of the topic $2 unless it is
// ""), the earliest to finish first, then by id, at most $3.
const listSQL = `
SELECT storage_key, seq, topic, attempts, enqueued_at, finished_at, last_error, requeues, {{now}}
FROM {{.T}}
WHERE status = {{p 1 "text"}} AND ({{p 2 "text"}} = '' OR topic = {{p 2 "text"}})
ORDER BY finished_at, id
LIMIT {{p 3 "bigint"}}`

// Listed is a message as List reads it.
type Listed struct {
	ID         string
	Topic      string
	Attempts   int
	EnqueuedAt time.Time
	FinishedAt *time.Time
	LastError  *string
	Requeues   int
	// Now is the server's clock at the read.
	Now time.Time
}

// List reads the messages in state (of topic, unless it is ""), those
// that finished earliest first, at most limit of them (0: all).
func (t *Table) List(ctx context.Context, db DB, state State, topic string, limit int) ([]Listed, error) {
	lim := int64(math.MaxInt64) // all: a bound, since SQLite refuses LIMIT NULL
	if limit > 0 {
		lim = int64(limit)
	}
	rows, err := db.Query(ctx, t.sql.list, string(state), topic, lim)
	if err != nil {
		return nil, fmt.Errorf("lifecycle: list: %w", err)
	}
	got, err := Collect(rows, func(row Rows) (Listed, error) {
		var m Listed
		var key string
		var seq, attempts, requeues int32
		err := row.Scan(&key, &seq, &m.Topic, &attempts, &m.EnqueuedAt, &m.FinishedAt, &m.LastError, &requeues, &m.Now)
		m.ID, m.Attempts, m.Requeues = MessageID(key, int(seq)), int(attempts), int(requeues)
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("lifecycle: list: %w", err)
	}
	return got, nil
}
