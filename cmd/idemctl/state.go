package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/go-idempotency/idempotency/pgstore"
	"github.com/go-idempotency/idempotency/state"
)

var stateCmd = &command{
	name:    "state",
	summary: "show a state record (package state), its history and where its events are",
	usage:   `-scope S -machine M -id ID [-postgres URL] [-table T] [-outbox T] [-limit N] [-json]`,
	help: `
Shows a state record of package state: its state, version and data, and
its last transitions (-limit, 0 for all), each with the request or call
that committed it (its idempotency key, storage key and epoch, and its
trace), and where its event is in the outbox: ready, claimed, done,
dead... or "purged" once the relays' retention deleted the delivered
message (the history keeps the transition). It works on PostgreSQL only:
-postgres (or DATABASE_URL), -table (the records' table, as given to
state.WithTable; its history is <table>_history) and -outbox (the outbox
table, as given to state.WithOutboxTable).

A record is named by -scope (its tenant), -machine and -id, as the
application gave them to the Store. An event's ID is "<event key>/<version>";
the event key (state.EventKey) is shown with the record. A record that
does not exist is exit status 3. -json prints one object: the record, and
its history with each event's delivery.`,
	examples: `  idemctl state -postgres "$DATABASE_URL" -scope acme -machine payments.payment -id pay_123
  idemctl state -postgres "$DATABASE_URL" -scope acme -machine payments.payment -id pay_123 -limit 0 -json`,
	run: runState,
}

// stateOptions are the command's flags.
type stateOptions struct {
	postgres, table, outbox string
	timeout                 time.Duration
	ref                     state.Ref
	limit                   int
	asJSON                  bool
}

func runState(ctx context.Context, c *cli, cmd *command, args []string) int {
	var o stateOptions
	fs := newFlagSet(cmd)
	fs.StringVar(&o.postgres, "postgres", "", "PostgreSQL connection `URL`; env DATABASE_URL")
	fs.StringVar(&o.table, "table", pgstore.DefaultStateTable, "the state records' `table`, optionally schema.table (state.WithTable)")
	fs.StringVar(&o.outbox, "outbox", pgstore.DefaultOutboxTable, "the outbox `table` of the events, optionally schema.table (state.WithOutboxTable)")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "give up after this `duration` (0: never)")
	fs.StringVar(&o.ref.Scope, "scope", "", "the record's `scope` (its tenant)")
	fs.StringVar(&o.ref.Machine, "machine", "", "the record's `machine` (payments.payment)")
	fs.StringVar(&o.ref.ID, "id", "", "the record's `id`")
	fs.IntVar(&o.limit, "limit", 20, "show the last `n` transitions (0: all)")
	fs.BoolVar(&o.asJSON, "json", false, "print JSON")
	if status, ok := parseFlags(c, cmd, fs, args); !ok {
		return status
	}
	if err := o.check(fs); err != nil {
		return c.fail(cmd, err)
	}
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	url := o.postgres
	if url == "" {
		url = c.getenv("DATABASE_URL")
	}
	if url == "" {
		return c.fail(cmd, usagef("no database: give -postgres (or set DATABASE_URL); state records are in PostgreSQL only"))
	}
	b, err := openPostgres(ctx, url, o.table)
	if err != nil {
		return c.fail(cmd, err)
	}
	defer b.close()
	s := state.New(b.conn, state.WithTable(o.table), state.WithOutboxTable(o.outbox))
	res, err := readState(ctx, s, o)
	if errors.Is(err, state.ErrNotFound) {
		fmt.Fprintf(c.stderr, "idemctl state: no record %s %s in scope %s (%s, table %s)\n",
			safe(o.ref.Machine), safe(o.ref.ID), safe(o.ref.Scope), b.where, b.table.String())
		return exitNotFound
	}
	if err != nil {
		return c.fail(cmd, err)
	}
	res.Store, res.Table = b.where, b.table.String()
	if o.asJSON {
		return c.printJSON(cmd, res)
	}
	res.writeText(c.stdout)
	return exitOK
}

// check checks the flags of fs given against one another, the record's
// names against their grammar.
func (o *stateOptions) check(fs *flag.FlagSet) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, name := range []string{"scope", "machine", "id"} {
		if !set[name] {
			return usagef("give -scope, -machine and -id: the record's names (-%s is missing)", name)
		}
	}
	for _, err := range []error{state.ValidScope(o.ref.Scope), state.ValidMachine(o.ref.Machine), state.ValidID(o.ref.ID)} {
		if err != nil {
			return usagef("%v", err)
		}
	}
	for _, t := range []struct{ flag, name string }{{"table", o.table}, {"outbox", o.outbox}} {
		if _, err := parseTable(t.name); err != nil {
			return usagef("-%s: %v", t.flag, err)
		}
	}
	if _, err := parseTable(pgstore.StateHistoryTable(o.table)); err != nil {
		return usagef("-table %q: its history's name is too long: %v", o.table, err)
	}
	if o.limit < 0 {
		return usagef("-limit %d is negative", o.limit)
	}
	return nil
}

// stateResult is what the command shows.
type stateResult struct {
	Store    string       `json:"store"`
	Table    string       `json:"table"`
	EventKey string       `json:"event_key"`
	Record   state.Record `json:"record"`
	// History are the last transitions shown, oldest first; Earlier
	// counts those before them.
	History []transition `json:"history"`
	Earlier int64        `json:"earlier"`
}

// transition is a history row with its event's delivery.
type transition struct {
	state.Event
	At time.Time `json:"at"`
	// Delivery is the event's state in the outbox, "purged" when the
	// outbox no longer holds it, "unreadable" when its message cannot be
	// read (Unreadable says why).
	Delivery   string  `json:"delivery"`
	Attempts   int     `json:"attempts"`
	LastError  *string `json:"last_error,omitempty"`
	Unreadable string  `json:"unreadable,omitempty"`
}

// readState reads the record of o, its last transitions and their
// deliveries.
func readState(ctx context.Context, s *state.Store, o stateOptions) (*stateResult, error) {
	rec, err := s.Get(ctx, o.ref)
	if err != nil {
		return nil, err
	}
	transitions := rec.Version - 1
	var after int64
	if o.limit > 0 && transitions > int64(o.limit) {
		after = rec.Version - int64(o.limit)
	}
	history, err := s.History(ctx, o.ref, after, 0)
	if err != nil {
		return nil, err
	}
	deliveries, err := s.Deliveries(ctx, o.ref)
	if err != nil {
		return nil, err
	}
	byVersion := map[int64]state.Delivery{}
	for _, d := range deliveries {
		byVersion[d.Version] = d
	}
	res := &stateResult{EventKey: state.EventKey(o.ref), Record: rec, History: []transition{}, Earlier: after - 1}
	if after == 0 {
		res.Earlier = 0
	}
	for _, ev := range history {
		tr := transition{Event: ev, At: ev.At, Delivery: "purged"}
		if d, ok := byVersion[ev.Version]; ok {
			tr.Delivery, tr.Attempts, tr.LastError = string(d.State), d.Attempts, d.LastError
			if d.Err != nil {
				tr.Delivery, tr.Unreadable = "unreadable", d.Err.Error()
			}
		}
		res.History = append(res.History, tr)
	}
	return res, nil
}

// maxDataShown bounds the data the text output shows, in bytes.
const maxDataShown = 512

// writeText writes r for people.
func (r *stateResult) writeText(w io.Writer) {
	rec := r.Record
	fmt.Fprintf(w, "%s, table %s\n\n", r.Store, r.Table)
	fmt.Fprintf(w, "record     %s %s\n", safe(rec.Machine), safe(rec.ID))
	fmt.Fprintf(w, "scope      %s\n", safe(rec.Scope))
	fmt.Fprintf(w, "state      %s\n", safe(rec.State))
	fmt.Fprintf(w, "version    %d\n", rec.Version)
	fmt.Fprintf(w, "created    %s\n", rec.CreatedAt.UTC().Format(time.RFC3339Nano))
	fmt.Fprintf(w, "updated    %s\n", rec.UpdatedAt.UTC().Format(time.RFC3339Nano))
	data := string(rec.Data)
	if len(data) > maxDataShown {
		data = fmt.Sprintf("%s... (%d bytes)", strings.ToValidUTF8(data[:maxDataShown], ""), len(rec.Data))
	}
	fmt.Fprintf(w, "data       %s\n", safe(data))
	fmt.Fprintf(w, "event key  %s (event IDs: <key>/<version>)\n", r.EventKey)

	n := rec.Version - 1
	fmt.Fprintf(w, "\nhistory: %d transition%s", n, plural(n))
	if r.Earlier > 0 {
		fmt.Fprintf(w, " (the last %d shown)", len(r.History))
	}
	fmt.Fprintln(w)
	for _, tr := range r.History {
		cause := "no idempotency key"
		if tr.Cause.Key != "" {
			cause = fmt.Sprintf("key %s (epoch %d)", safe(tr.Cause.Key), tr.Cause.Epoch)
		}
		if tp := tr.Cause.Trace["traceparent"]; tp != "" {
			cause += ", trace " + safe(tp)
		}
		delivery := tr.Delivery
		if tr.Attempts > 0 {
			delivery += fmt.Sprintf(", %d attempt%s", tr.Attempts, plural(int64(tr.Attempts)))
		}
		if tr.LastError != nil {
			delivery += ": " + safe(*tr.LastError)
		}
		if tr.Unreadable != "" {
			delivery += " (" + safe(tr.Unreadable) + ")"
		}
		fmt.Fprintf(w, "  v%-4d %s -> %s  at %s  %s  event %s\n", tr.Version, safe(tr.From), safe(tr.To),
			tr.At.UTC().Format(time.RFC3339Nano), cause, delivery)
	}
}

func plural(n int64) string {
	if n == 1 {
		return ""
	}
	return "s"
}
