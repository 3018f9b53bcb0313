package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/user"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/pgstore"
)

var outboxCmd = &command{
	name:    "outbox",
	summary: "show the outbox's messages by state; schedule, cancel, suspend, resume, requeue and purge them",
	usage: `[status] [-postgres URL] [-table T] [-json]
       idemctl outbox dead [-topic T] [-limit N] [-json]
       idemctl outbox schedule MESSAGE-ID... (-at TIME | -in DURATION) [-json]
       idemctl outbox cancel MESSAGE-ID... [-reason TEXT] [-by NAME] [-json]
       idemctl outbox suspend (MESSAGE-ID... | -topic T | -key K) [-reason TEXT] [-by NAME] [-json]
       idemctl outbox resume (MESSAGE-ID... | -topic T | -key K | -all) [-json]
       idemctl outbox requeue (MESSAGE-ID... | -all [-topic T] [-state S]) [-by NAME] [-json]
       idemctl outbox purge (MESSAGE-ID... | -done | -dead | -canceled) [-older D] [-topic T] [-batch N] [-json]`,
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

A message is a durable run (package outbox/lifecycle): scheduled (not due
before its time), ready (due, waiting for a relay), claimed (a relay
presents it), retry_wait (the sink failed; due again after a backoff),
suspended (held by an operator or by its sink, until resumed); and then
done, dead (out of attempts, refused by the sink, or unreadable) or
canceled. Those last three are finished: nothing changes them but a
requeue. One message of an ordering key is presented at a time, in
enqueue order: an earlier message not finished, scheduled or suspended
included, holds the later ones back.

status (the default) counts the messages of each state in one snapshot
(reading the whole table): those due now, those scheduled for later or
waiting for a retry's backoff, the claims that ran out (their relay died
or stalled: the next relay takes them back, an attempt counted). Then the
earliest due message, with how long it has been due (the relays' lag) and
since it was enqueued; the last errors of the messages waiting for a
retry, and of the dead ones, each grouped by text (a message's own ID in
it shown as <id>, so that one cause is one group), with how many messages
each, the group of the most recently enqueued message first, at most 5
groups; the suspended messages by reason; and the claimed messages of
each relay (claimed_by: relay.WithName).

dead lists the dead messages, the earliest to die first, with their
attempts and their last error. -topic keeps one topic; output stops after
-limit messages (0: no limit). -json prints one JSON object per line.

schedule makes the named messages, scheduled, ready or waiting for a
retry, fall due at -at (RFC 3339) or -in after the server's clock:
scheduled until then.

cancel cancels the named messages that are not finished, with last_error
"canceled: by <-by> with idemctl[: <-reason>]". One a relay is presenting
has its sink's context cancelled at the relay's next extend, and its done
mark refused. Its later messages of the ordering key go on.

suspend holds messages, scheduled, ready, waiting for a retry or claimed
(its relay's marks are then refused), until resume: named ones, or every
one of a -topic or an ordering -key. A suspension counts no attempt, and
holds the later messages of its ordering key back. resume makes suspended
messages ready and due now, or scheduled when their due time (a schedule,
a retry's backoff) is later: named ones, those of a -topic or a -key, or
-all (those a sink suspended, too).

requeue makes finished messages (done, dead or canceled) ready again, due
now, their attempts reset to 0 (so they get the relays' whole
WithMaxAttempts again), and records it: the requeues counted, when, and
-by whom (the OS user by default). Name them, or give -all for every one of
-state (dead by default; with -topic: of that topic). It keeps last_error
and claimed_by, which say why and where the message last failed, until
the next attempt overwrites them. A requeued message is published before
the later messages of its ordering key not finished (they wait for it),
but after those already finished. Fix the cause first, or the messages
die again.

purge deletes finished messages (done, dead, canceled), never one not
finished: named ones (all or none), or -done, -dead and -canceled (any of
them) that finished at least -older ago, which must be given (0: all), of
one -topic if given, in transactions of -batch rows. The relays purge them
after their retention (relay.WithRetention) already; purging sooner than
the records' TTL lets a key used again, once its record expired, give a
new message the ID of a purged one, which downstream deduplication may
then drop.

Named messages are changed all or none: a message whose state the
subcommand does not act on is refused (exit status 4), an unknown ID is
exit status 3, and then nothing changes. schedule, cancel, resume and
requeue wake the relays (pg_notify on the table's channel) in the same
transaction. Each prints how many messages it changed, and their IDs;
-json prints an object with the action, the table, the count, the IDs and
the state each was left in (null for purge -done/-dead/-canceled).`,
	examples: `  idemctl outbox -postgres "$DATABASE_URL"
  idemctl outbox status -postgres "$DATABASE_URL" -table billing.outbox -json
  idemctl outbox dead -postgres "$DATABASE_URL" -topic orders.created -limit 20
  idemctl outbox suspend -postgres "$DATABASE_URL" -topic orders.created -reason "orders service down"
  idemctl outbox resume -postgres "$DATABASE_URL" -topic orders.created
  idemctl outbox schedule -postgres "$DATABASE_URL" -in 1h 3f0c5a2be0f1cb0a2b5cf4c1d5b6f1e2a1c1f5d7e8e9f0a1b2c3d4e5f6a7b8c9/1
  idemctl outbox cancel -postgres "$DATABASE_URL" -reason "refunded by hand" 3f0c5a2be0f1cb0a2b5cf4c1d5b6f1e2a1c1f5d7e8e9f0a1b2c3d4e5f6a7b8c9/2
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
	table, err := outbox.Table(b.table.String())
	if err != nil {
		return c.fail(cmd, err)
	}
	return fn(ctx, &outboxStore{b, table})
}

// outboxOptions are the subcommands' flags.
type outboxOptions struct {
	topic, key, state  string
	reason, by         string
	at                 string
	in                 time.Duration
	limit              int
	all                bool
	dead, done, cancel bool
	older              time.Duration
	batch              int
	asJSON             bool
	subcommand         string
	ids                []string          // as given, each once, valid
	bulk               bool              // not by IDs: -topic, -key, -all, purge -done/-dead/-canceled
	states             []lifecycle.State // requeue -all, purge: the finished states selected
	when               lifecycle.When    // schedule
}

// outboxFlags are the flags each subcommand takes besides the connection
// and -json.
var outboxFlags = map[string][]string{
	"status":   nil,
	"dead":     {"topic", "limit"},
	"schedule": {"at", "in"},
	"cancel":   {"reason", "by"},
	"suspend":  {"topic", "key", "reason", "by"},
	"resume":   {"topic", "key", "all"},
	"requeue":  {"all", "topic", "state", "by"},
	"purge":    {"done", "dead", "canceled", "older", "topic", "batch"},
}

func runOutbox(ctx context.Context, c *cli, cmd *command, args []string) int {
	var conn outboxConn
	fs := newFlagSet(cmd, &conn)
	var o outboxOptions
	fs.StringVar(&o.topic, "topic", "", "dead, suspend, resume, requeue -all, purge -done/-dead/-canceled: only the messages of this `topic`")
	fs.StringVar(&o.key, "key", "", "suspend, resume: the messages of this ordering `key`")
	fs.StringVar(&o.state, "state", "dead", "requeue -all: the finished `state` to requeue: dead, done or canceled")
	fs.StringVar(&o.reason, "reason", "", "cancel, suspend: why, kept with the message (`text`)")
	fs.StringVar(&o.by, "by", "", "cancel, suspend, requeue: who does it, recorded with the message (`name`; default: the OS user)")
	fs.StringVar(&o.at, "at", "", "schedule: the `time` the messages fall due (RFC 3339)")
	fs.DurationVar(&o.in, "in", 0, "schedule: fall due this `duration` after the server's clock")
	fs.IntVar(&o.limit, "limit", 100, "dead: stop after `n` messages (0: no limit)")
	fs.BoolVar(&o.all, "all", false, "resume: every suspended message; requeue: every message of -state")
	fs.BoolVar(&o.done, "done", false, "purge: the done messages finished -older ago")
	fs.BoolVar(&o.dead, "dead", false, "purge: the dead messages finished -older ago")
	fs.BoolVar(&o.cancel, "canceled", false, "purge: the canceled messages finished -older ago")
	fs.DurationVar(&o.older, "older", 0, "purge -done/-dead/-canceled: only messages that finished at least this `duration` ago (required; 0: all)")
	fs.IntVar(&o.batch, "batch", 1000, "purge -done/-dead/-canceled: delete `n` rows per transaction")
	fs.BoolVar(&o.asJSON, "json", false, "print JSON (dead: one object per message and line)")
	pos, status, ok := parse(c, cmd, fs, args)
	if !ok {
		return status
	}
	if err := o.check(fs, pos); err != nil {
		return c.fail(cmd, err)
	}
	if o.by == "" {
		o.by = osUser(c)
	}
	return conn.connected(ctx, c, cmd, func(ctx context.Context, s *outboxStore) int {
		switch o.subcommand {
		case "status":
			return s.runStatus(ctx, c, cmd, o)
		case "dead":
			return s.runDead(ctx, c, cmd, o)
		}
		return s.runChange(ctx, c, cmd, o)
	})
}

// osUser returns the name of the user running idemctl, for -by.
func osUser(c *cli) string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	for _, v := range []string{"USER", "LOGNAME"} {
		if name := c.getenv(v); name != "" {
			return name
		}
	}
	return "unknown"
}

// check sets o's subcommand, message IDs and selection from the
// positional arguments pos, and checks them and the flags of fs given
// against one another.
func (o *outboxOptions) check(fs *flag.FlagSet, pos []string) error {
	o.subcommand = "status"
	if len(pos) > 0 {
		o.subcommand, pos = pos[0], pos[1:]
	}
	own, ok := outboxFlags[o.subcommand]
	if !ok {
		return usagef("unknown subcommand %q: want status, dead, schedule, cancel, suspend, resume, requeue or purge", o.subcommand)
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
	}
	if err := o.checkSelection(set, len(pos) > 0); err != nil {
		return err
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

// checkSelection checks how the subcommand's messages are selected:
// named (byID), or by its bulk flags.
func (o *outboxOptions) checkSelection(set map[string]bool, byID bool) error {
	var bulkFlags string // what selects messages without IDs
	switch o.subcommand {
	case "schedule":
		switch {
		case set["at"] == set["in"]:
			return usagef("give -at TIME or -in DURATION: when the messages fall due")
		case set["at"]:
			at, err := time.Parse(time.RFC3339, o.at)
			if err != nil {
				return usagef("-at %q is not an RFC 3339 time (2026-12-01T09:30:00Z): %v", o.at, err)
			}
			o.when.At = at
		case o.in < 0:
			return usagef("-in %v is negative", o.in)
		default:
			o.when.In = o.in
		}
	case "suspend":
		bulkFlags, o.bulk = "-topic or -key", o.topic != "" || o.key != ""
	case "resume":
		bulkFlags, o.bulk = "-topic, -key or -all", o.topic != "" || o.key != "" || o.all
		if o.all && (o.topic != "" || o.key != "") {
			return usagef("-all resumes every suspended message: leave out -topic and -key")
		}
	case "requeue":
		bulkFlags, o.bulk = "-all", o.all
		st := lifecycle.State(o.state)
		if !st.IsTerminal() {
			return usagef("-state %q: want dead, done or canceled (a finished state)", o.state)
		}
		o.states = []lifecycle.State{st}
		switch {
		case !o.bulk && o.topic != "":
			return usagef("-topic goes with -all, not with message IDs")
		case !o.bulk && set["state"]:
			return usagef("-state goes with -all, not with message IDs")
		}
	case "purge":
		bulkFlags, o.bulk = "-done, -dead or -canceled", o.done || o.dead || o.cancel
		o.states = nil
		for _, s := range []struct {
			on    bool
			state lifecycle.State
		}{{o.done, lifecycle.Done}, {o.dead, lifecycle.Dead}, {o.cancel, lifecycle.Canceled}} {
			if s.on {
				o.states = append(o.states, s.state)
			}
		}
		switch {
		case !o.bulk && o.topic != "":
			return usagef("-topic goes with %s, not with message IDs", bulkFlags)
		case !o.bulk && (set["older"] || set["batch"]):
			return usagef("-older and -batch go with %s, not with message IDs", bulkFlags)
		case o.bulk && !set["older"]:
			return usagef("purge %s needs -older D: only the messages that finished at least D ago (-older 0: all of them)", o.given())
		case o.older < 0:
			return usagef("-older %v is negative", o.older)
		case o.batch < 1:
			return usagef("-batch %d: want at least 1", o.batch)
		}
	}
	switch {
	case o.bulk && byID:
		return usagef("give message IDs or %s, not both", bulkFlags)
	case !o.bulk && !byID && bulkFlags == "":
		return usagef("name the messages: their IDs (<storage key>/<sequence>)")
	case !o.bulk && !byID:
		return usagef("name the messages: their IDs (<storage key>/<sequence>), or %s", bulkFlags)
	}
	return nil
}

// given returns purge's state flags as given: "-done -dead".
func (o *outboxOptions) given() string {
	var flags []string
	for _, s := range o.states {
		flags = append(flags, "-"+string(s))
	}
	return strings.Join(flags, " ")
}

// outboxStore works on the outbox table (see pgstore/outbox.sql) through a
// pgBackend whose table is the outbox's, with the edges and queries of
// package outbox/lifecycle: no statement of idemctl's own.
type outboxStore struct {
	*pgBackend
	t *lifecycle.Table
}

// maxErrorGroups bounds the groups of errors status shows of each state.
const maxErrorGroups = 5

// outboxStatus is what status found.
type outboxStatus struct {
	Store      string    `json:"store"`
	Table      string    `json:"table"`
	ServerTime time.Time `json:"server_time"`
	// States counts the messages of every state.
	States map[lifecycle.State]int64 `json:"states"`
	// Due are the messages due now (scheduled, ready or waiting for a
	// retry, their due time passed); ScheduledLater and RetryWaiting the
	// scheduled ones and those waiting for a retry that are not due yet.
	Due            int64 `json:"due"`
	ScheduledLater int64 `json:"scheduled_later"`
	RetryWaiting   int64 `json:"retry_waiting"`
	// ClaimedRanOut are claimed with a claim that ran out.
	ClaimedRanOut int64 `json:"claimed_ran_out"`
	// Requeued are the messages an operator requeued at least once.
	Requeued int64 `json:"requeued"`
	Total    int64 `json:"total"`
	// OldestDue is the earliest due message, nil when none is due.
	OldestDue *oldestDue `json:"oldest_due"`
	// Failures are the last errors of the messages waiting for a retry,
	// grouped, the group of the most recently enqueued message first; at
	// most maxErrorGroups of FailureGroups groups, of FailedMessages
	// messages in all. DeadErrors are the dead messages', alike.
	Failures        []failureGroup `json:"failures"`
	FailureGroups   int64          `json:"failure_groups"`
	FailedMessages  int64          `json:"failed_messages"`
	DeadErrors      []failureGroup `json:"dead_errors"`
	DeadErrorGroups int64          `json:"dead_error_groups"`
	DeadMessages    int64          `json:"dead_messages"`
	// Suspended are the suspended messages by reason.
	Suspended []suspendedReason `json:"suspended"`
	// Relays are the relays holding claims, by name.
	Relays []relayClaims `json:"relays"`
}

// oldestDue is the message that has been due the longest.
type oldestDue struct {
	ID         string          `json:"id"`
	State      lifecycle.State `json:"state"`
	Topic      string          `json:"topic"`
	Attempts   int             `json:"attempts"`
	EnqueuedAt time.Time       `json:"enqueued_at"`
	DueAt      time.Time       `json:"due_at"`
	AgeMS      int64           `json:"age_ms"`     // since enqueued
	DueForMS   int64           `json:"due_for_ms"` // since due: the relays' lag
}

// failureGroup are the messages of one state whose last error is one
// text.
type failureGroup struct {
	// Error is their last_error, with each message's own ID as <id>.
	Error    string `json:"error"`
	Messages int64  `json:"messages"`
	// LatestID is the group's most recently enqueued message.
	LatestID string `json:"latest_id"`
}

// suspendedReason are the messages suspended for one reason.
type suspendedReason struct {
	Reason   string `json:"reason"`
	Messages int64  `json:"messages"`
}

// relayClaims are the claimed messages of one relay.
type relayClaims struct {
	Relay   string `json:"relay"` // claimed_by; "" when not set
	Claimed int64  `json:"claimed"`
	RanOut  int64  `json:"ran_out"` // of them, with a claim that ran out
}

func (s *outboxStore) runStatus(ctx context.Context, c *cli, cmd *command, o outboxOptions) int {
	res, err := s.status(ctx)
	if err != nil {
		return c.fail(cmd, err)
	}
	if o.asJSON {
		return c.printJSON(cmd, res)
	}
	res.writeText(c.stdout)
	return exitOK
}

// status reads the table's status in one snapshot (a read-only,
// repeatable-read transaction).
func (s *outboxStore) status(ctx context.Context) (*outboxStatus, error) {
	tx, err := s.conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	st, err := s.t.Status(ctx, lifecycle.Pgx(tx), maxErrorGroups)
	if err != nil {
		return nil, err
	}
	res := &outboxStatus{
		Store: s.where, Table: s.table.String(), ServerTime: st.Now, States: st.Counts,
		ClaimedRanOut: st.RanOut, Requeued: st.Requeued, Total: st.Total,
		ScheduledLater: st.Counts[lifecycle.Scheduled] - st.Due[lifecycle.Scheduled],
		RetryWaiting:   st.Counts[lifecycle.RetryWait] - st.Due[lifecycle.RetryWait],
	}
	for _, n := range st.Due {
		res.Due += n
	}
	if o := st.Oldest; o != nil {
		res.OldestDue = &oldestDue{
			ID: o.ID, State: o.State, Topic: o.Topic, Attempts: o.Attempts, EnqueuedAt: o.EnqueuedAt, DueAt: o.DueAt,
			AgeMS: st.Now.Sub(o.EnqueuedAt).Milliseconds(), DueForMS: st.Now.Sub(o.DueAt).Milliseconds(),
		}
	}
	groups := func(g lifecycle.ErrorGroups) []failureGroup {
		out := []failureGroup{}
		for _, e := range g.Shown {
			out = append(out, failureGroup{Error: e.Error, Messages: e.Messages, LatestID: e.LatestID})
		}
		return out
	}
	retry, dead := st.Errors[lifecycle.RetryWait], st.Errors[lifecycle.Dead]
	res.Failures, res.FailureGroups, res.FailedMessages = groups(retry), retry.Groups, retry.Messages
	res.DeadErrors, res.DeadErrorGroups, res.DeadMessages = groups(dead), dead.Groups, dead.Messages
	res.Suspended = []suspendedReason{}
	for _, r := range st.Suspended {
		res.Suspended = append(res.Suspended, suspendedReason{Reason: r.Reason, Messages: r.Messages})
	}
	res.Relays = []relayClaims{}
	for _, r := range st.Relays {
		res.Relays = append(res.Relays, relayClaims{Relay: r.Relay, Claimed: r.Claimed, RanOut: r.RanOut})
	}
	return res, nil
}

// writeText writes s for people.
func (s *outboxStatus) writeText(w io.Writer) {
	fmt.Fprintf(w, "%s, table %s: %s\n\n", s.Store, s.Table, messages(s.Total, ""))
	tw := newTabWriter(w)
	fmt.Fprintln(tw, "STATE\tMESSAGES\tDETAIL")
	n := func(st lifecycle.State) int64 { return s.States[st] }
	fmt.Fprintf(tw, "%s\t%d\t%d due now, %d later\n", lifecycle.Scheduled, n(lifecycle.Scheduled), n(lifecycle.Scheduled)-s.ScheduledLater, s.ScheduledLater)
	fmt.Fprintf(tw, "%s\t%d\tdue, waiting for a relay\n", lifecycle.Ready, n(lifecycle.Ready))
	fmt.Fprintf(tw, "%s\t%d\t%d with a claim that ran out\n", lifecycle.Claimed, n(lifecycle.Claimed), s.ClaimedRanOut)
	fmt.Fprintf(tw, "%s\t%d\t%d due again, %d waiting for their backoff\n", lifecycle.RetryWait, n(lifecycle.RetryWait), n(lifecycle.RetryWait)-s.RetryWaiting, s.RetryWaiting)
	fmt.Fprintf(tw, "%s\t%d\theld until resumed\n", lifecycle.Suspended, n(lifecycle.Suspended))
	fmt.Fprintf(tw, "%s\t%d\tpublished\n", lifecycle.Done, n(lifecycle.Done))
	dead := "out of attempts, refused or unreadable"
	if n(lifecycle.Dead) > 0 {
		dead += ": idemctl outbox dead lists them"
	}
	fmt.Fprintf(tw, "%s\t%d\t%s\n", lifecycle.Dead, n(lifecycle.Dead), dead)
	fmt.Fprintf(tw, "%s\t%d\tby an application or an operator\n", lifecycle.Canceled, n(lifecycle.Canceled))
	// The last line: a line of two cells among lines of three would end
	// the block of lines whose columns are aligned.
	fmt.Fprintf(tw, "total\t%d\n", s.Total)
	tw.Flush()
	if s.Requeued > 0 {
		fmt.Fprintf(w, "requeued by an operator at least once: %s\n", messages(s.Requeued, ""))
	}
	if o := s.OldestDue; o != nil {
		fmt.Fprintf(w, "\noldest due: %s (topic %s, %d attempts so far): due for %s, enqueued %s ago\n",
			safe(o.ID), safe(o.Topic), o.Attempts, human(time.Duration(o.DueForMS)*time.Millisecond),
			human(time.Duration(o.AgeMS)*time.Millisecond))
	} else {
		fmt.Fprintf(w, "\noldest due: none (no message is due)\n")
	}
	writeGroups(w, "waiting for a retry", s.Failures, s.FailureGroups, s.FailedMessages)
	writeGroups(w, "dead", s.DeadErrors, s.DeadErrorGroups, s.DeadMessages)
	if len(s.Suspended) > 0 {
		fmt.Fprintln(w)
		tw = newTabWriter(w)
		fmt.Fprintln(tw, "SUSPENDED\tREASON")
		for _, r := range s.Suspended {
			reason := "-"
			if r.Reason != "" {
				reason = safe(r.Reason)
			}
			fmt.Fprintf(tw, "%d\t%s\n", r.Messages, reason)
		}
		tw.Flush()
	}
	if len(s.Relays) == 0 {
		fmt.Fprintf(w, "\nrelays: none holds a claim\n")
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

// writeGroups writes why the messages of one state (what) failed last, for
// people: shown of groups groups of total messages.
func writeGroups(w io.Writer, what string, shown []failureGroup, groups, total int64) {
	if len(shown) == 0 {
		return
	}
	fmt.Fprintf(w, "\n%s: %s, by last error (the latest message's first)\n", what, messages(total, ""))
	tw := newTabWriter(w)
	fmt.Fprintln(tw, "MESSAGES\tLAST ERROR")
	for _, f := range shown {
		fmt.Fprintf(tw, "%d\t%s\n", f.Messages, safe(f.Error))
	}
	tw.Flush()
	if more := groups - int64(len(shown)); more > 0 {
		var n int64
		for _, f := range shown {
			n += f.Messages
		}
		others := fmt.Sprintf("%d other errors", more)
		if more == 1 {
			others = "1 other error"
		}
		fmt.Fprintf(w, "and %s with %s\n", messages(total-n, "more "), others)
	}
}

// deadMessage is a dead message as dead shows it.
type deadMessage struct {
	ID         string     `json:"id"`
	Topic      string     `json:"topic"`
	Attempts   int        `json:"attempts"`
	Requeues   int        `json:"requeues"`
	EnqueuedAt time.Time  `json:"enqueued_at"`
	FinishedAt *time.Time `json:"finished_at"`
	DeadForMS  *int64     `json:"dead_for_ms,omitempty"`
	LastError  *string    `json:"last_error"`
}

func (s *outboxStore) runDead(ctx context.Context, c *cli, cmd *command, o outboxOptions) int {
	limit := 0
	if o.limit > 0 {
		limit = o.limit + 1 // one more: whether the limit stopped the list
	}
	listed, err := s.t.List(ctx, lifecycle.Pgx(s.conn), lifecycle.Dead, o.topic, limit)
	if err != nil {
		return c.fail(cmd, err)
	}
	more := o.limit > 0 && len(listed) > o.limit
	if more {
		listed = listed[:o.limit]
	}
	dead := make([]deadMessage, len(listed))
	for i, l := range listed {
		dead[i] = deadMessage{ID: l.ID, Topic: l.Topic, Attempts: l.Attempts, Requeues: l.Requeues,
			EnqueuedAt: l.EnqueuedAt, FinishedAt: l.FinishedAt, LastError: l.LastError}
		if l.FinishedAt != nil {
			d := l.Now.Sub(*l.FinishedAt)
			dead[i].DeadForMS = ms(&d)
		}
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

// outboxChange is what a subcommand that changes messages changed.
type outboxChange struct {
	Action string `json:"action"` // scheduled, canceled, suspended, resumed, requeued or purged
	Table  string `json:"table"`
	Count  int64  `json:"count"`
	// IDs are the messages changed, and States the state each was left
	// in (null for purge -done/-dead/-canceled, which counts only).
	IDs    []string          `json:"ids"`
	States []lifecycle.State `json:"states"`
}

// actions are the past tenses of the subcommands that change messages.
var actions = map[string]string{
	"schedule": "scheduled", "cancel": "canceled", "suspend": "suspended",
	"resume": "resumed", "requeue": "requeued", "purge": "purged",
}

// edges are the lifecycle's edges of the subcommands that change messages:
// the states each acts on are the edge's.
var edges = map[string]lifecycle.Edge{
	"schedule": lifecycle.EdgeSchedule, "cancel": lifecycle.EdgeCancel, "suspend": lifecycle.EdgeSuspend,
	"resume": lifecycle.EdgeResume, "requeue": lifecycle.EdgeRequeue, "purge": lifecycle.EdgePurge,
}

// errIDs says that named messages were refused or not found; the reasons
// were reported.
type errIDs struct{ status int }

func (e errIDs) Error() string { return "messages refused or not found" }

func (s *outboxStore) runChange(ctx context.Context, c *cli, cmd *command, o outboxOptions) int {
	res := &outboxChange{Action: actions[o.subcommand], Table: s.table.String()}
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
	of := ""
	switch {
	case o.topic != "":
		of = " of topic " + safe(o.topic)
	case o.key != "":
		of = " of ordering key " + safe(o.key)
	}
	notified := ""
	if res.Count > 0 && o.subcommand != "suspend" && o.subcommand != "purge" {
		notified = "; relays notified"
	}
	switch o.subcommand {
	case "schedule":
		due := "due at " + o.when.At.UTC().Format(time.RFC3339)
		if o.when.At.IsZero() {
			due = "due in " + human(o.when.In)
		}
		fmt.Fprintf(c.stdout, "scheduled %s in %s: %s%s\n", messages(res.Count, ""), res.Table, due, notified)
	case "cancel":
		fmt.Fprintf(c.stdout, "canceled %s in %s: never presented again%s\n", messages(res.Count, ""), res.Table, notified)
	case "suspend":
		fmt.Fprintf(c.stdout, "suspended %s%s in %s: held until resumed\n", messages(res.Count, ""), of, res.Table)
	case "resume":
		fmt.Fprintf(c.stdout, "resumed %s%s in %s: ready, or scheduled until their due time%s\n", messages(res.Count, ""), of, res.Table, notified)
	case "requeue":
		kind := ""
		if o.bulk {
			kind = string(o.states[0]) + " "
		}
		fmt.Fprintf(c.stdout, "requeued %s%s in %s by %s: ready, due now, attempts reset to 0%s\n",
			messages(res.Count, kind), of, res.Table, safe(o.by), notified)
	case "purge":
		if o.bulk {
			fmt.Fprintf(c.stdout, "purged %s%s from %s that finished at least %s ago\n",
				messages(res.Count, o.stateWords()+" "), of, res.Table, human(o.older))
		} else {
			fmt.Fprintf(c.stdout, "purged %s from %s\n", messages(res.Count, ""), res.Table)
		}
	}
	for i, id := range res.IDs {
		if o.subcommand == "schedule" || o.subcommand == "resume" {
			fmt.Fprintf(c.stdout, "  %s  %s\n", safe(id), res.States[i])
		} else {
			fmt.Fprintf(c.stdout, "  %s\n", safe(id))
		}
	}
	return exitOK
}

// stateWords names purge's states for people: "done and dead".
func (o *outboxOptions) stateWords() string {
	words := make([]string, len(o.states))
	for i, s := range o.states {
		words[i] = string(s)
	}
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " and " + words[len(words)-1]
}

// change runs the subcommand's edge on the messages o selects, in one
// transaction, and notifies the relays of messages that may be due now.
// Named messages are changed only when every one is there and in a state
// the edge acts on; otherwise the reasons are reported on c's stderr,
// nothing changes, and the error is an errIDs.
func (s *outboxStore) change(ctx context.Context, c *cli, o outboxOptions, res *outboxChange) error {
	tx, err := s.conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	sel := lifecycle.Selector{Topic: o.topic, OrderingKey: o.key, All: o.all}
	if !o.bulk {
		if err := s.lock(ctx, tx, c, o); err != nil {
			return err
		}
		sel = lifecycle.Selector{IDs: o.ids}
	}
	var changed []lifecycle.Changed
	switch o.subcommand {
	case "schedule":
		changed, err = s.t.Schedule(ctx, lifecycle.Pgx(tx), o.ids, o.when)
	case "cancel":
		reason := "by " + o.by + " with idemctl"
		if o.reason != "" {
			reason += ": " + o.reason
		}
		changed, err = s.t.Cancel(ctx, lifecycle.Pgx(tx), o.ids, reason)
	case "suspend":
		reason := "by " + o.by + " with idemctl"
		if o.reason != "" {
			reason = o.reason + " (" + reason + ")"
		}
		changed, err = s.t.Suspend(ctx, lifecycle.Pgx(tx), sel, reason)
	case "resume":
		changed, err = s.t.Resume(ctx, lifecycle.Pgx(tx), sel)
	case "requeue":
		states := o.states
		if !o.bulk {
			states = nil // a named message in any finished state
		}
		changed, err = s.t.Requeue(ctx, lifecycle.Pgx(tx), sel, states, o.by)
	case "purge":
		changed, err = s.t.Purge(ctx, lifecycle.Pgx(tx), lifecycle.PurgeFilter{Selector: sel, Limit: len(o.ids)})
	}
	if err != nil {
		return err
	}
	if !o.bulk && len(changed) != len(o.ids) {
		// The rows are locked: they cannot have changed since lock read them.
		return fmt.Errorf("%d of the %d messages changed, although they were locked", len(changed), len(o.ids))
	}
	slices.SortFunc(changed, func(a, b lifecycle.Changed) int { return cmp.Compare(a.RowID, b.RowID) })
	if len(changed) > 0 && o.subcommand != "suspend" && o.subcommand != "purge" {
		if err := s.t.Notify(ctx, lifecycle.Pgx(tx)); err != nil {
			return err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	res.Count = int64(len(changed))
	res.IDs, res.States = []string{}, []lifecycle.State{}
	for _, ch := range changed {
		res.IDs = append(res.IDs, ch.ID)
		res.States = append(res.States, ch.State)
	}
	if o.subcommand == "purge" {
		res.States = nil
	}
	return nil
}

// lock reads and locks the rows of the messages o names in tx, and checks
// that each is there and in a state o's subcommand acts on. Otherwise it
// reports on c's stderr why not, and returns an errIDs.
func (s *outboxStore) lock(ctx context.Context, tx pgx.Tx, c *cli, o outboxOptions) error {
	found, err := s.t.Lookup(ctx, lifecycle.Pgx(tx), o.ids)
	if err != nil {
		return err
	}
	problem := exitOK
	report := func(code int, format string, args ...any) {
		fmt.Fprintf(c.stderr, "idemctl outbox %s: %s\n", o.subcommand, fmt.Sprintf(format, args...))
		// A message that is not there is the more basic mistake.
		if problem == exitOK || code == exitNotFound {
			problem = code
		}
	}
	edge := edges[o.subcommand]
	for _, id := range o.ids {
		f, ok := found[id]
		switch {
		case !ok:
			report(exitNotFound, "no message %s in %s", safe(id), s.table.String())
		case !edge.Allows(f.State):
			report(exitRefused, "%s is %s: %s", safe(id), describeState(f), refusal(o.subcommand, edge, f.State))
		}
	}
	if problem != exitOK {
		return errIDs{problem}
	}
	return nil
}

// refusal says why subcommand, whose edge is edge, does not act on a
// message in state.
func refusal(subcommand string, edge lifecycle.Edge, state lifecycle.State) string {
	from := make([]string, len(edge.From()))
	for i, s := range edge.From() {
		from[i] = string(s)
	}
	acts := fmt.Sprintf("%s acts on %s messages only", subcommand, or(from))
	switch {
	case subcommand == "purge":
		return "purge deletes finished messages only (done, dead, canceled), never one still to be published"
	case state == lifecycle.Claimed:
		return acts + ", and a relay is publishing this one"
	case state == lifecycle.Suspended:
		return acts + ", and this one is suspended: resume it first"
	case state.IsTerminal():
		return acts + ", and this one is finished: requeue it first"
	case subcommand == "requeue":
		return acts + ", and this one is not finished: it is due or waiting already"
	}
	return acts
}

// or joins words with commas and a last "or".
func or(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

// messages returns "1 <kind>message" or "<n> <kind>messages".
func messages(n int64, kind string) string {
	if n == 1 {
		return "1 " + kind + "message"
	}
	return fmt.Sprintf("%d %smessages", n, kind)
}

// describeState names a message's state for people.
func describeState(f lifecycle.Found) string {
	s := string(f.State)
	if f.State == lifecycle.Claimed && f.ClaimedBy != "" {
		s += " by relay " + safe(f.ClaimedBy)
	}
	return s
}

// purge deletes the finished messages o selects, -batch at a time,
// counting them in res as it goes.
func (s *outboxStore) purge(ctx context.Context, o outboxOptions, res *outboxChange) error {
	for {
		got, err := s.t.Purge(ctx, lifecycle.Pgx(s.conn), lifecycle.PurgeFilter{
			Selector: lifecycle.Selector{Topic: o.topic, All: true}, States: o.states, Older: o.older, Limit: o.batch,
		})
		if err != nil {
			return err
		}
		res.Count += int64(len(got))
		if len(got) < o.batch {
			return nil
		}
	}
}
