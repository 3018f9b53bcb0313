package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/pgstore"
)

var outboxCmd = &command{
	name:    "outbox",
	summary: "show the outbox's messages; list, requeue and purge dead ones",
	usage: `[status] [-postgres URL] [-table T] [-json]
       idemctl outbox dead [-topic T] [-limit N] [-json]
       idemctl outbox requeue (MESSAGE-ID... | -all [-topic T]) [-json]
       idemctl outbox purge (MESSAGE-ID... | -dead | -done) [-older D] [-topic T] [-batch N] [-json]`,
	help: `
Shows and repairs the transactional outbox (package outbox): the messages
that handlers on transactional routes enqueue into a PostgreSQL table with
their records, and that relays (package outbox/relay) claim and publish. It
works on PostgreSQL only: -postgres (or DATABASE_URL) and -table, the outbox
table as given to pgstore.WithOutboxTable and relay.WithTable. Every time is
read from the server's clock. A message is named by its ID, "<storage
key>/<sequence>" (the ID the sink was given, Envelope.ID): the storage key
of the record that enqueued it, a slash, and its place among the record's
messages, from 1.

status (the default) counts the messages by status in one query (which
reads the whole table): pending, split into those due now and those waiting
for a retry after a failed publish; claimed, with those whose claim ran out
(their relay died or stalled: the next relay takes them back, an attempt
counted); done; and dead. Then the earliest due message, with how long it
has been due (the relays' lag) and since it was enqueued; why the pending
messages whose last attempt failed failed: their last errors, grouped by
text (a message's own ID in it shown as <id>, so that one cause is one
group), with how many messages each, the group of the most recently
enqueued message first, at most 5 groups; and the claimed messages of
each relay (claimed_by: relay.WithName). A due message may still wait for
an earlier one of its ordering key.

dead lists the dead messages, those whose last allowed attempt failed
(relay.WithMaxAttempts), the earliest to die first, with their attempts and
the error of the last one. -topic keeps one topic; output stops after
-limit messages (0: no limit). -json prints one JSON object per line.

requeue makes dead messages pending again: due now, their attempts reset to
0 (so they get the relays' whole WithMaxAttempts again), and it wakes the
relays (pg_notify on the table's channel) in the same transaction. It keeps
last_error and claimed_by, which say why and where the message last failed,
until the next attempt overwrites them. Name the messages by ID, or give
-all for every dead one (with -topic: of that topic). Only a dead message is
requeued: a pending, claimed or done one named is refused (exit status 4),
an unknown ID is exit status 3, and then nothing changes. A requeued message
is published before the later messages of its ordering key still pending
(they wait for it), but after those already done. Fix the cause first, or
the messages die again.

purge deletes done and dead messages, never a pending or claimed one: one
named is refused (exit status 4; there is no -force), an unknown ID is exit
status 3, and then nothing is deleted. -dead and -done (either or both)
delete those that finished at least -older ago, which must be given (0:
all), of one -topic if given, in transactions of -batch rows. The relays
purge them after their retention (relay.WithRetention) already; purging
sooner than the records' TTL lets a key used again, once its record
expired, give a new message the ID of a purged one, which downstream
deduplication may then drop.

requeue and purge print how many messages they changed, and the IDs of
those requeued or named; -json prints an object with the action, the table,
the count and the IDs (null for purge -dead and -done).`,
	examples: `  idemctl outbox -postgres "$DATABASE_URL"
  idemctl outbox status -postgres "$DATABASE_URL" -table billing.outbox -json
  idemctl outbox dead -postgres "$DATABASE_URL" -topic orders.created -limit 20
  idemctl outbox requeue -postgres "$DATABASE_URL" 3f0c5a2be0f1cb0a2b5cf4c1d5b6f1e2a1c1f5d7e8e9f0a1b2c3d4e5f6a7b8c9/1
  idemctl outbox requeue -postgres "$DATABASE_URL" -all -topic orders.created
  idemctl outbox purge -postgres "$DATABASE_URL" -dead -older 72h`,
	run: runOutbox,
}

// outboxConn are the flags that say where the outbox is.
type outboxConn struct {
	postgres, table string
	timeout         time.Duration
}

func (f *outboxConn) register(fs *flag.FlagSet) {
	fs.StringVar(&f.postgres, "postgres", "", "PostgreSQL connection `URL`; env DATABASE_URL")
	fs.StringVar(&f.table, "table", pgstore.DefaultOutboxTable, "the outbox `table`, optionally schema.table (pgstore.WithOutboxTable, relay.WithTable)")
	fs.DurationVar(&f.timeout, "timeout", 30*time.Second, "give up after this `duration` (0: never)")
}

// connected connects to the outbox the flags (or DATABASE_URL) name and
// returns what fn returns with it, all within -timeout, as
// connFlags.connected does.
func (f *outboxConn) connected(ctx context.Context, c *cli, cmd *command, fn func(context.Context, *outboxStore) int) int {
	if f.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, f.timeout)
		defer cancel()
	}
	url := f.postgres
	if url == "" {
		url = c.getenv("DATABASE_URL")
	}
	if url == "" {
		return c.fail(cmd, usagef("no database: give -postgres (or set DATABASE_URL); the outbox is in PostgreSQL only"))
	}
	b, err := openPostgres(ctx, url, f.table)
	if err != nil {
		return c.fail(cmd, err)
	}
	defer b.close()
	return fn(ctx, &outboxStore{b})
}

// outboxOptions are the subcommands' flags.
type outboxOptions struct {
	topic       string
	limit       int
	all         bool
	dead, done  bool
	older       time.Duration
	batch       int
	asJSON      bool
	subcommand  string
	ids         []string // as given, each once, valid
	bulk        bool     // requeue -all, purge -dead or -done
	purgeStates []string // purge: the statuses -dead and -done select
}

// outboxFlags are the flags each subcommand takes besides the connection
// and -json.
var outboxFlags = map[string][]string{
	"status":  nil,
	"dead":    {"topic", "limit"},
	"requeue": {"all", "topic"},
	"purge":   {"dead", "done", "older", "topic", "batch"},
}

func runOutbox(ctx context.Context, c *cli, cmd *command, args []string) int {
	var conn outboxConn
	fs := newFlagSet(cmd, &conn)
	var o outboxOptions
	fs.StringVar(&o.topic, "topic", "", "dead, requeue -all, purge -dead/-done: only the messages of this `topic`")
	fs.IntVar(&o.limit, "limit", 100, "dead: stop after `n` messages (0: no limit)")
	fs.BoolVar(&o.all, "all", false, "requeue: every dead message (with -topic: of that topic)")
	fs.BoolVar(&o.dead, "dead", false, "purge: the dead messages finished -older ago")
	fs.BoolVar(&o.done, "done", false, "purge: the done messages finished -older ago")
	fs.DurationVar(&o.older, "older", 0, "purge -dead/-done: only messages that finished at least this `duration` ago (required; 0: all)")
	fs.IntVar(&o.batch, "batch", 1000, "purge -dead/-done: delete `n` rows per transaction")
	fs.BoolVar(&o.asJSON, "json", false, "print JSON (dead: one object per message and line)")
	pos, status, ok := parse(c, cmd, fs, args)
	if !ok {
		return status
	}
	if err := o.check(fs, pos); err != nil {
		return c.fail(cmd, err)
	}
	return conn.connected(ctx, c, cmd, func(ctx context.Context, s *outboxStore) int {
		switch o.subcommand {
		case "dead":
			return s.runDead(ctx, c, cmd, o)
		case "requeue", "purge":
			return s.runChange(ctx, c, cmd, o)
		}
		res, err := s.status(ctx)
		if err != nil {
			return c.fail(cmd, err)
		}
		if o.asJSON {
			return c.printJSON(cmd, res)
		}
		res.writeText(c.stdout)
		return exitOK
	})
}

// check sets o's subcommand and message IDs from the positional arguments
// pos, and checks them and the flags of fs given against one another.
func (o *outboxOptions) check(fs *flag.FlagSet, pos []string) error {
	o.subcommand = "status"
	if len(pos) > 0 {
		o.subcommand, pos = pos[0], pos[1:]
	}
	own, ok := outboxFlags[o.subcommand]
	if !ok {
		return usagef("unknown subcommand %q: want status, dead, requeue or purge", o.subcommand)
	}
	set := map[string]bool{} // the flags given
	var stray error
	fs.Visit(func(f *flag.Flag) {
		set[f.Name] = true
		switch f.Name {
		case "json", "postgres", "table", "timeout":
			return
		}
		if !slices.Contains(own, f.Name) && stray == nil {
			stray = usagef("-%s is not a flag of outbox %s", f.Name, o.subcommand)
		}
	})
	if stray != nil {
		return stray
	}
	switch o.subcommand {
	case "status", "dead":
		if len(pos) > 0 {
			return usagef("unexpected argument %q", pos[0])
		}
		if o.limit < 0 {
			return usagef("-limit %d is negative", o.limit)
		}
		return nil
	case "requeue":
		o.bulk = o.all
	case "purge":
		o.bulk = o.dead || o.done
		if o.done {
			o.purgeStates = append(o.purgeStates, outbox.StatusDone)
		}
		if o.dead {
			o.purgeStates = append(o.purgeStates, outbox.StatusDead)
		}
	}
	bulkFlags, given := "-all", "-all"
	if o.subcommand == "purge" {
		bulkFlags, given = "-dead or -done", "-"+strings.Join(o.purgeStates, " -")
	}
	switch {
	case o.bulk && len(pos) > 0:
		return usagef("give message IDs or %s, not both", bulkFlags)
	case !o.bulk && len(pos) == 0:
		return usagef("name the messages: their IDs (<storage key>/<sequence>), or %s", bulkFlags)
	case !o.bulk && o.topic != "":
		return usagef("-topic goes with %s, not with message IDs", bulkFlags)
	case o.subcommand == "purge" && !o.bulk && (set["older"] || set["batch"]):
		return usagef("-older and -batch go with -dead or -done, not with message IDs")
	case o.subcommand == "purge" && o.bulk && !set["older"]:
		return usagef("purge %s needs -older D: only the messages that finished at least D ago (-older 0: all of them)", given)
	case o.older < 0:
		return usagef("-older %v is negative", o.older)
	case o.batch < 1:
		return usagef("-batch %d: want at least 1", o.batch)
	}
	for _, id := range pos {
		if _, _, err := outbox.ParseID(id); err != nil {
			return usagef("%v", err)
		}
		if !slices.Contains(o.ids, id) {
			o.ids = append(o.ids, id)
		}
	}
	return nil
}

// outboxStore works on the outbox table (see pgstore/outbox.sql) through a
// pgBackend whose table is the outbox's.
type outboxStore struct{ *pgBackend }

// channel is the table's LISTEN/NOTIFY channel, on which relays wait.
func (s *outboxStore) channel() string { return outbox.Channel(s.table.Name()) }

// outboxStatusSQL reads status's counts, the earliest due message and the
// claims by relay in one statement, so from one snapshot and one reading of
// the server's clock.
const outboxStatusSQL = `
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS n),
counts AS (
	SELECT
		count(*) FILTER (WHERE o.status = 'pending' AND o.next_attempt_at <= now.n) AS due,
		count(*) FILTER (WHERE o.status = 'pending' AND o.next_attempt_at > now.n) AS waiting,
		count(*) FILTER (WHERE o.status = 'claimed') AS claimed,
		count(*) FILTER (WHERE o.status = 'claimed' AND o.claim_until <= now.n) AS ran_out,
		count(*) FILTER (WHERE o.status = 'done') AS done,
		count(*) FILTER (WHERE o.status = 'dead') AS dead,
		count(*) AS total
	FROM {table} o, now
),
oldest AS (
	SELECT o.storage_key, o.seq, o.topic, o.attempts, o.enqueued_at, o.next_attempt_at
	FROM {table} o, now
	WHERE o.status = 'pending' AND o.next_attempt_at <= now.n
	ORDER BY o.next_attempt_at, o.id
	LIMIT 1
),
failures AS (
	SELECT replace(o.last_error, o.storage_key || '/' || o.seq, '<id>') AS error,
		count(*) AS messages, max(o.id) AS latest
	FROM {table} o
	WHERE o.status = 'pending' AND o.last_error IS NOT NULL
	GROUP BY 1
),
shown_failures AS (
	SELECT f.error, f.messages, l.storage_key || '/' || l.seq AS latest_id, f.latest
	FROM failures f JOIN {table} l ON l.id = f.latest
	ORDER BY f.latest DESC
	LIMIT ` + maxErrorGroups + `
),
relays AS (
	SELECT coalesce(o.claimed_by, '') AS name, count(*) AS claimed,
		count(*) FILTER (WHERE o.claim_until <= now.n) AS ran_out
	FROM {table} o, now
	WHERE o.status = 'claimed'
	GROUP BY 1
)
SELECT now.n, c.due, c.waiting, c.claimed, c.ran_out, c.done, c.dead, c.total,
	oldest.storage_key, oldest.seq, oldest.topic, oldest.attempts, oldest.enqueued_at, oldest.next_attempt_at,
	coalesce((SELECT array_agg(r.name ORDER BY r.name) FROM relays r), '{}'),
	coalesce((SELECT array_agg(r.claimed ORDER BY r.name) FROM relays r), '{}'),
	coalesce((SELECT array_agg(r.ran_out ORDER BY r.name) FROM relays r), '{}'),
	coalesce((SELECT array_agg(f.error ORDER BY f.latest DESC) FROM shown_failures f), '{}'),
	coalesce((SELECT array_agg(f.messages ORDER BY f.latest DESC) FROM shown_failures f), '{}'),
	coalesce((SELECT array_agg(f.latest_id ORDER BY f.latest DESC) FROM shown_failures f), '{}'),
	(SELECT count(*) FROM failures), coalesce((SELECT sum(f.messages) FROM failures f), 0)
FROM now CROSS JOIN counts c LEFT JOIN oldest ON true`

// maxErrorGroups bounds the groups of errors status shows.
const maxErrorGroups = "5"

// outboxStatus is what status found.
type outboxStatus struct {
	Store      string    `json:"store"`
	Table      string    `json:"table"`
	ServerTime time.Time `json:"server_time"`
	Pending    int64     `json:"pending"`
	// PendingDue are due now, PendingWaiting wait for a retry.
	PendingDue     int64 `json:"pending_due"`
	PendingWaiting int64 `json:"pending_waiting"`
	Claimed        int64 `json:"claimed"`
	// ClaimedRanOut are claimed with a claim that ran out.
	ClaimedRanOut int64 `json:"claimed_ran_out"`
	Done          int64 `json:"done"`
	Dead          int64 `json:"dead"`
	Total         int64 `json:"total"`
	// OldestDue is the earliest due pending message, nil when none is due.
	OldestDue *oldestDue `json:"oldest_due"`
	// Failures are the last errors of the pending messages whose last
	// attempt failed, grouped, the group of the most recently enqueued
	// message first; at most maxErrorGroups of FailureGroups groups, of
	// FailedMessages messages in all.
	Failures       []failureGroup `json:"failures"`
	FailureGroups  int64          `json:"failure_groups"`
	FailedMessages int64          `json:"failed_messages"`
	// Relays are the relays holding claims, by name.
	Relays []relayClaims `json:"relays"`
}

// oldestDue is the pending message that has been due the longest.
type oldestDue struct {
	ID            string    `json:"id"`
	Topic         string    `json:"topic"`
	Attempts      int       `json:"attempts"`
	EnqueuedAt    time.Time `json:"enqueued_at"`
	NextAttemptAt time.Time `json:"next_attempt_at"`
	AgeMS         int64     `json:"age_ms"`     // since enqueued
	DueForMS      int64     `json:"due_for_ms"` // since due: the relays' lag
}

// failureGroup are the pending messages whose last attempt failed with one
// error.
type failureGroup struct {
	// Error is their last_error, with each message's own ID as <id>.
	Error    string `json:"error"`
	Messages int64  `json:"messages"`
	// LatestID is the group's most recently enqueued message.
	LatestID string `json:"latest_id"`
}

// relayClaims are the claimed messages of one relay.
type relayClaims struct {
	Relay   string `json:"relay"` // claimed_by; "" when not set
	Claimed int64  `json:"claimed"`
	RanOut  int64  `json:"ran_out"` // of them, with a claim that ran out
}

func (s *outboxStore) status(ctx context.Context) (*outboxStatus, error) {
	res := &outboxStatus{Store: s.where, Table: s.table.String()}
	var (
		key, topic            *string
		seq, attempts         *int32
		enqueued, nextAttempt *time.Time
		names                 []string
		claimed, ranOut       []int64
		errTexts, latestIDs   []string
		errCounts             []int64
	)
	err := s.conn.QueryRow(ctx, s.sql(outboxStatusSQL)).Scan(&res.ServerTime,
		&res.PendingDue, &res.PendingWaiting, &res.Claimed, &res.ClaimedRanOut, &res.Done, &res.Dead, &res.Total,
		&key, &seq, &topic, &attempts, &enqueued, &nextAttempt, &names, &claimed, &ranOut,
		&errTexts, &errCounts, &latestIDs, &res.FailureGroups, &res.FailedMessages)
	if err != nil {
		return nil, err
	}
	res.Pending = res.PendingDue + res.PendingWaiting
	if key != nil && seq != nil && topic != nil && attempts != nil && enqueued != nil && nextAttempt != nil {
		res.OldestDue = &oldestDue{
			ID: outbox.ID(*key, int(*seq)), Topic: *topic, Attempts: int(*attempts),
			EnqueuedAt: *enqueued, NextAttemptAt: *nextAttempt,
			AgeMS: res.ServerTime.Sub(*enqueued).Milliseconds(), DueForMS: res.ServerTime.Sub(*nextAttempt).Milliseconds(),
		}
	}
	if len(claimed) != len(names) || len(ranOut) != len(names) {
		return nil, errors.New("the claims by relay came back in arrays of different lengths")
	}
	res.Relays = []relayClaims{}
	for i, name := range names {
		res.Relays = append(res.Relays, relayClaims{Relay: name, Claimed: claimed[i], RanOut: ranOut[i]})
	}
	if len(errCounts) != len(errTexts) || len(latestIDs) != len(errTexts) {
		return nil, errors.New("the errors of the pending messages came back in arrays of different lengths")
	}
	res.Failures = []failureGroup{}
	for i, text := range errTexts {
		res.Failures = append(res.Failures, failureGroup{Error: text, Messages: errCounts[i], LatestID: latestIDs[i]})
	}
	return res, nil
}

// writeText writes s for people.
func (s *outboxStatus) writeText(w io.Writer) {
	fmt.Fprintf(w, "%s, table %s: %s\n\n", s.Store, s.Table, messages(s.Total, ""))
	tw := newTabWriter(w)
	fmt.Fprintln(tw, "STATUS\tMESSAGES\tDETAIL")
	fmt.Fprintf(tw, "pending\t%d\t%d due now, %d waiting for a retry\n", s.Pending, s.PendingDue, s.PendingWaiting)
	fmt.Fprintf(tw, "claimed\t%d\t%d with a claim that ran out\n", s.Claimed, s.ClaimedRanOut)
	fmt.Fprintf(tw, "done\t%d\tpublished\n", s.Done)
	dead := "out of attempts"
	if s.Dead > 0 {
		dead += ": idemctl outbox dead lists them"
	}
	fmt.Fprintf(tw, "dead\t%d\t%s\n", s.Dead, dead)
	// The last line: a line of two cells among lines of three would end
	// the block of lines whose columns are aligned.
	fmt.Fprintf(tw, "total\t%d\n", s.Total)
	tw.Flush()
	if o := s.OldestDue; o != nil {
		fmt.Fprintf(w, "\noldest due: %s (topic %s, %d attempts so far): due for %s, enqueued %s ago\n",
			safe(o.ID), safe(o.Topic), o.Attempts, human(time.Duration(o.DueForMS)*time.Millisecond),
			human(time.Duration(o.AgeMS)*time.Millisecond))
	} else {
		fmt.Fprintf(w, "\noldest due: none (no pending message is due)\n")
	}
	s.writeFailures(w)
	if len(s.Relays) == 0 {
		if len(s.Failures) > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "relays: none holds a claim\n")
		return
	}
	fmt.Fprintln(w)
	tw = newTabWriter(w)
	fmt.Fprintln(tw, "RELAY\tCLAIMED\tRAN OUT")
	for _, r := range s.Relays {
		name := "-"
		if r.Relay != "" {
			name = safe(r.Relay)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\n", name, r.Claimed, r.RanOut)
	}
	tw.Flush()
}

// writeFailures writes why the pending messages whose last attempt failed
// failed, for people.
func (s *outboxStatus) writeFailures(w io.Writer) {
	if len(s.Failures) == 0 {
		return
	}
	fmt.Fprintf(w, "\npending after a failed attempt: %s, by last error (the latest message's first)\n", messages(s.FailedMessages, ""))
	tw := newTabWriter(w)
	fmt.Fprintln(tw, "MESSAGES\tLAST ERROR")
	for _, f := range s.Failures {
		fmt.Fprintf(tw, "%d\t%s\n", f.Messages, safe(f.Error))
	}
	tw.Flush()
	if more := s.FailureGroups - int64(len(s.Failures)); more > 0 {
		var shown int64
		for _, f := range s.Failures {
			shown += f.Messages
		}
		others := fmt.Sprintf("%d other errors", more)
		if more == 1 {
			others = "1 other error"
		}
		fmt.Fprintf(w, "and %s with %s\n", messages(s.FailedMessages-shown, "more "), others)
	}
}

// outboxDeadSQL reads the dead messages, the earliest to die first: $1 the
// topic ("" for all), $2 the limit (NULL for none).
const outboxDeadSQL = `
SELECT storage_key, seq, topic, attempts, enqueued_at, finished_at, last_error, clock_timestamp()
FROM {table}
WHERE status = 'dead' AND ($1::text = '' OR topic = $1::text)
ORDER BY finished_at, id
LIMIT $2::bigint`

// deadMessage is a dead message as dead shows it.
type deadMessage struct {
	ID         string     `json:"id"`
	Topic      string     `json:"topic"`
	Attempts   int        `json:"attempts"`
	EnqueuedAt time.Time  `json:"enqueued_at"`
	FinishedAt *time.Time `json:"finished_at"`
	DeadForMS  *int64     `json:"dead_for_ms,omitempty"`
	LastError  *string    `json:"last_error"`
}

func (s *outboxStore) runDead(ctx context.Context, c *cli, cmd *command, o outboxOptions) int {
	var limit *int64
	if o.limit > 0 {
		n := int64(o.limit) + 1 // one more: whether the limit stopped the list
		limit = &n
	}
	rows, err := s.conn.Query(ctx, s.sql(outboxDeadSQL), o.topic, limit)
	if err != nil {
		return c.fail(cmd, err)
	}
	var dead []deadMessage
	for rows.Next() {
		var m deadMessage
		var key string
		var seq int32
		var now time.Time
		if err := rows.Scan(&key, &seq, &m.Topic, &m.Attempts, &m.EnqueuedAt, &m.FinishedAt, &m.LastError, &now); err != nil {
			rows.Close()
			return c.fail(cmd, err)
		}
		m.ID = outbox.ID(key, int(seq))
		if m.FinishedAt != nil {
			d := now.Sub(*m.FinishedAt)
			m.DeadForMS = ms(&d)
		}
		dead = append(dead, m)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return c.fail(cmd, err)
	}
	more := o.limit > 0 && len(dead) > o.limit
	if more {
		dead = dead[:o.limit]
	}
	if o.asJSON {
		for _, m := range dead {
			if err := writeJSON(c.stdout, m); err != nil {
				return c.fail(cmd, err)
			}
		}
	} else {
		tw := newTabWriter(c.stdout)
		fmt.Fprintln(tw, "ID\tTOPIC\tATTEMPTS\tFINISHED\tLAST ERROR")
		for _, m := range dead {
			finished, lastErr := "-", "-"
			if m.FinishedAt != nil {
				finished = m.FinishedAt.UTC().Format(time.RFC3339)
			}
			if m.LastError != nil {
				lastErr = safe(*m.LastError)
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", safe(m.ID), safe(m.Topic), m.Attempts, finished, lastErr)
		}
		if err := tw.Flush(); err != nil {
			return c.fail(cmd, err)
		}
	}
	if more {
		fmt.Fprintf(c.stderr, "idemctl outbox dead: stopped at -limit %d; there are more (idemctl outbox status counts them)\n", o.limit)
	}
	return exitOK
}

// requeueSet is what requeue sets: a message pending again, due now, its
// attempts reset, no claim. last_error and claimed_by stay.
const requeueSet = `
UPDATE {table} SET
	status = 'pending', attempts = 0, next_attempt_at = clock_timestamp(), finished_at = NULL,
	claim_token = NULL, claim_until = NULL`

// outboxRequeueIDsSQL requeues the dead messages among the ids $1.
const outboxRequeueIDsSQL = requeueSet + `
WHERE status = 'dead' AND id = ANY ($1::bigint[])
RETURNING id, storage_key, seq`

// outboxRequeueAllSQL requeues every dead message, of the topic $1 unless
// it is "".
const outboxRequeueAllSQL = requeueSet + `
WHERE status = 'dead' AND ($1::text = '' OR topic = $1::text)
RETURNING id, storage_key, seq`

// outboxPurgeIDsSQL deletes the done and dead messages among the ids $1.
const outboxPurgeIDsSQL = `
DELETE FROM {table}
WHERE status IN ('done', 'dead') AND id = ANY ($1::bigint[])
RETURNING id, storage_key, seq`

// outboxPurgeSQL deletes at most $4 messages of the statuses $1 (done,
// dead or both) that finished at least $2 ago, of the topic $3 unless it
// is "", oldest first, as the relays' purge does; pending and claimed
// messages never.
const outboxPurgeSQL = `
DELETE FROM {table}
WHERE status IN ('done', 'dead') AND id = ANY (ARRAY(
	SELECT id FROM {table}
	WHERE status IN ('done', 'dead') AND status = ANY ($1::text[])
		AND finished_at <= clock_timestamp() - $2::interval
		AND ($3::text = '' OR topic = $3::text)
	ORDER BY finished_at
	LIMIT $4::integer
	FOR UPDATE SKIP LOCKED
))`

// outboxLockSQL reads and locks the rows of the messages named by $1
// (storage keys) and $2 (sequences).
const outboxLockSQL = `
SELECT id, storage_key, seq, status, claimed_by
FROM {table}
WHERE (storage_key, seq) IN (SELECT k, s FROM unnest($1::text[], $2::integer[]) AS m(k, s))
FOR UPDATE`

// outboxChange is what requeue or purge changed.
type outboxChange struct {
	Action string   `json:"action"` // requeued or purged
	Table  string   `json:"table"`
	Count  int64    `json:"count"`
	IDs    []string `json:"ids"` // requeue, and purge of named messages; null for purge -dead/-done
}

// errIDs says that named messages were refused or not found; the reasons
// were reported.
type errIDs struct{ status int }

func (e errIDs) Error() string { return "messages refused or not found" }

func (s *outboxStore) runChange(ctx context.Context, c *cli, cmd *command, o outboxOptions) int {
	res := &outboxChange{Action: "requeued", Table: s.table.String()}
	if o.subcommand == "purge" {
		res.Action = "purged"
	}
	var err error
	if o.subcommand == "purge" && o.bulk {
		err = s.purge(ctx, o, res)
	} else {
		err = s.change(ctx, c, o, res)
	}
	var ids errIDs
	switch {
	case errors.As(err, &ids):
		fmt.Fprintf(c.stderr, "idemctl outbox %s: nothing %s (%s)\n", o.subcommand, res.Action, s.describe())
		return ids.status
	case err != nil:
		if res.Count > 0 {
			fmt.Fprintf(c.stderr, "idemctl outbox %s: %s %s before the error\n", o.subcommand, messages(res.Count, ""), res.Action)
		}
		return c.fail(cmd, err)
	}
	if o.asJSON {
		return c.printJSON(cmd, res)
	}
	topic := ""
	if o.topic != "" {
		topic = " of topic " + safe(o.topic)
	}
	switch {
	case o.subcommand == "requeue":
		notified := ""
		if res.Count > 0 {
			notified = "; relays notified"
		}
		fmt.Fprintf(c.stdout, "requeued %s%s in %s: pending, due now, attempts reset to 0%s\n",
			messages(res.Count, "dead "), topic, res.Table, notified)
	case o.bulk:
		fmt.Fprintf(c.stdout, "purged %s%s from %s that finished at least %s ago\n",
			messages(res.Count, strings.Join(o.purgeStates, " and ")+" "), topic, res.Table, human(o.older))
	default:
		fmt.Fprintf(c.stdout, "purged %s from %s\n", messages(res.Count, ""), res.Table)
	}
	for _, id := range res.IDs {
		fmt.Fprintf(c.stdout, "  %s\n", safe(id))
	}
	return exitOK
}

// change requeues (requeue) or deletes (purge) the messages o names, or
// requeues every dead one (requeue -all), in one transaction, and notifies
// the relays of requeued messages. Named messages are changed only when
// every one is there and in a status the subcommand acts on; otherwise
// the reasons are reported on c's stderr, nothing changes, and the error
// is an errIDs.
func (s *outboxStore) change(ctx context.Context, c *cli, o outboxOptions, res *outboxChange) error {
	tx, err := s.conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var rows pgx.Rows
	if o.bulk {
		rows, err = tx.Query(ctx, s.sql(outboxRequeueAllSQL), o.topic)
	} else {
		var ids []int64
		if ids, err = s.lock(ctx, tx, c, o); err != nil {
			return err
		}
		query := outboxRequeueIDsSQL
		if o.subcommand == "purge" {
			query = outboxPurgeIDsSQL
		}
		rows, err = tx.Query(ctx, s.sql(query), ids)
	}
	if err != nil {
		return err
	}
	type changed struct {
		id  int64
		msg string
	}
	var all []changed
	for rows.Next() {
		var ch changed
		var key string
		var seq int32
		if err := rows.Scan(&ch.id, &key, &seq); err != nil {
			rows.Close()
			return err
		}
		ch.msg = outbox.ID(key, int(seq))
		all = append(all, ch)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if len(o.ids) > 0 && len(all) != len(o.ids) {
		// The rows are locked: they cannot have changed since lock read them.
		return fmt.Errorf("%d of the %d messages changed, although they were locked", len(all), len(o.ids))
	}
	slices.SortFunc(all, func(a, b changed) int { return cmp.Compare(a.id, b.id) })
	if o.subcommand == "requeue" && len(all) > 0 {
		if _, err := tx.Exec(ctx, `SELECT pg_notify($1::text, '')`, s.channel()); err != nil {
			return err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	res.Count = int64(len(all))
	res.IDs = []string{}
	for _, ch := range all {
		res.IDs = append(res.IDs, ch.msg)
	}
	return nil
}

// lock reads and locks the rows of the messages o names in tx, and returns
// their ids when each is there and in a status o's subcommand acts on.
// Otherwise it reports on c's stderr why not, and returns an errIDs.
func (s *outboxStore) lock(ctx context.Context, tx pgx.Tx, c *cli, o outboxOptions) ([]int64, error) {
	keys := make([]string, len(o.ids))
	seqs := make([]int32, len(o.ids))
	for i, id := range o.ids {
		key, seq, _ := outbox.ParseID(id) // checked by check
		keys[i], seqs[i] = key, int32(seq)
	}
	rows, err := tx.Query(ctx, s.sql(outboxLockSQL), keys, seqs)
	if err != nil {
		return nil, err
	}
	type row struct {
		id      int64
		status  string
		claimer *string
	}
	found := map[string]row{}
	for rows.Next() {
		var r row
		var key string
		var seq int32
		if err := rows.Scan(&r.id, &key, &seq, &r.status, &r.claimer); err != nil {
			rows.Close()
			return nil, err
		}
		found[outbox.ID(key, int(seq))] = r
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var ids []int64
	problem := exitOK
	report := func(code int, format string, args ...any) {
		fmt.Fprintf(c.stderr, "idemctl outbox %s: %s\n", o.subcommand, fmt.Sprintf(format, args...))
		// A message that is not there is the more basic mistake.
		if problem == exitOK || code == exitNotFound {
			problem = code
		}
	}
	for _, id := range o.ids {
		r, ok := found[id]
		if !ok {
			report(exitNotFound, "no message %s in %s", safe(id), s.table.String())
			continue
		}
		if reason := refusal(o.subcommand, r.status, r.claimer); reason != "" {
			report(exitRefused, "%s is %s: %s", safe(id), describeStatus(r.status, r.claimer), reason)
			continue
		}
		ids = append(ids, r.id)
	}
	if problem != exitOK {
		return nil, errIDs{problem}
	}
	return ids, nil
}

// refusal says why subcommand does not act on a message in status, or ""
// when it does.
func refusal(subcommand, status string, claimer *string) string {
	switch {
	case subcommand == "requeue" && status == outbox.StatusDead:
		return ""
	case subcommand == "purge" && (status == outbox.StatusDone || status == outbox.StatusDead):
		return ""
	case subcommand == "purge":
		return "purge deletes done and dead messages only, never one still to be published"
	case status == outbox.StatusPending:
		return "requeue acts on dead messages only, and a pending one is due or waiting for a retry already"
	case status == outbox.StatusClaimed:
		return "requeue acts on dead messages only, and a relay is publishing this one"
	case status == outbox.StatusDone:
		return "requeue acts on dead messages only, and this one was published"
	}
	return "requeue acts on dead messages only"
}

// messages returns "1 <kind>message" or "<n> <kind>messages".
func messages(n int64, kind string) string {
	if n == 1 {
		return "1 " + kind + "message"
	}
	return fmt.Sprintf("%d %smessages", n, kind)
}

// describeStatus names a message's status for people.
func describeStatus(status string, claimer *string) string {
	s := safe(status)
	if status == outbox.StatusClaimed && claimer != nil && *claimer != "" {
		s += " by relay " + safe(*claimer)
	}
	return s
}

// purge deletes the done or dead messages o selects, -batch at a time,
// counting them in res as it goes.
func (s *outboxStore) purge(ctx context.Context, o outboxOptions, res *outboxChange) error {
	for {
		tag, err := s.conn.Exec(ctx, s.sql(outboxPurgeSQL), o.purgeStates, o.older, o.topic, o.batch)
		if err != nil {
			return err
		}
		res.Count += tag.RowsAffected()
		if tag.RowsAffected() < int64(o.batch) {
			return nil
		}
	}
}
