package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/go-idempotency/idempotency"
)

// listOptions are list's selection and pacing.
type listOptions struct {
	state string
	older time.Duration
	ttl   time.Duration
	limit int
	batch int
	pause time.Duration
	quiet bool
}

// normalizeState maps the spellings of a state given to -state to idemctl's.
func normalizeState(s string) (string, error) {
	switch strings.ToLower(strings.NewReplacer("-", "_", " ", "_").Replace(s)) {
	case "in_progress", "inprogress":
		return stateInProgress, nil
	case "complete", "completed":
		return stateComplete, nil
	case "corrupt":
		return stateCorrupt, nil
	case "expired":
		return stateExpired, nil
	case "all", "":
		return "all", nil
	}
	return "", usagef("-state %q: want in_progress, complete, corrupt, expired or all", s)
}

// ageFrom returns a record's age from the time left before its TTL
// deadline: the TTL (-ttl) minus that, never negative.
func (o listOptions) ageFrom(left time.Duration) *time.Duration {
	a := max(o.ttl-left, 0)
	return &a
}

// setAge sets r's age from its expiry (Redis: the key's expiry is the TTL
// deadline, or the lease's end when that is later).
func (o listOptions) setAge(r *record) {
	if r.ExpiresIn != nil && r.State != stateCorrupt {
		r.Age = o.ageFrom(*r.ExpiresIn)
	}
}

// selects reports whether list shows r.
func (o listOptions) selects(r *record) bool {
	if o.state != "all" && r.State != o.state {
		return false
	}
	if o.older > 0 && (r.Age == nil || *r.Age < o.older) {
		return false
	}
	return true
}

// errLimit stops a listing at -limit.
var errLimit = errors.New("limit reached")

var listCmd = &command{
	name:    "list",
	summary: "list records by state and age, in bounded batches",
	usage:   "[connection] [-state S] [-older D] [-ttl D] [-limit N] [-batch N] [-pause D] [-json] [-q]",
	help: `
Lists the records under the prefix (Redis) or in the table (PostgreSQL), with
their state, epoch, age, lease, time to expiry, status and body size.

-state selects in_progress, complete, corrupt (unreadable), expired (PostgreSQL
rows past their expiry, not yet purged) or all. -older D keeps records at
least D old. A record does not store when it was created: its age is the
route's TTL (-ttl, default the middleware's 24h) minus the time left before
its TTL deadline, so it counts from the acquire (or the last steal) for an
IN_PROGRESS record and from the completion for a COMPLETE one. Give the TTL
of the routes you look at; with a wrong -ttl ages are off by the difference.

Redis is read with SCAN (COUNT -batch) on every master, one node and one
batch at a time, with -pause between batches to spare a busy server; each
batch's records are read in one pipeline, at most 4 KiB of each stored
value (a record whose headers are longer is listed without its status, with
"unread" in -json; inspect reads it whole). PostgreSQL is read in pages of
-batch rows in key order (keyset pagination). A scan that takes a while
reports its progress on stderr (-q silences it). Output stops after -limit
records (0: no limit). -timeout bounds the whole listing: raise it (or give
0) for a large keyspace. The table is written every -batch rows, its columns
aligned within each; -json prints one JSON object per line instead.`,
	examples: `  idemctl list -redis 127.0.0.1:6379 -state in_progress -older 30s
  idemctl list -redis 10.0.0.1:6379,10.0.0.2:6379 -cluster -state complete -limit 20
  idemctl list -postgres "$DATABASE_URL" -state in_progress -older 10m -ttl 1h -json | jq -r .storage_key
  idemctl list -redis 127.0.0.1:6379 -batch 500 -pause 10ms -limit 0 -q > records.txt`,
	run: runList,
}

func runList(ctx context.Context, c *cli, cmd *command, args []string) int {
	var conn connFlags
	fs := newFlagSet(cmd, &conn)
	var opts listOptions
	state := fs.String("state", "all", "`state`: in_progress, complete, corrupt, expired or all")
	fs.DurationVar(&opts.older, "older", 0, "only records at least this `duration` old (see -ttl)")
	fs.DurationVar(&opts.ttl, "ttl", idempotency.DefaultTTL, "the routes' TTL, from which ages are computed")
	fs.IntVar(&opts.limit, "limit", 1000, "stop after `n` records (0: no limit)")
	fs.IntVar(&opts.batch, "batch", 1000, "`n` keys per SCAN (COUNT), or rows per page")
	fs.DurationVar(&opts.pause, "pause", 0, "pause this `duration` between batches")
	fs.BoolVar(&opts.quiet, "q", false, "no progress or summary on stderr")
	asJSON := fs.Bool("json", false, "print one JSON object per record and line")
	if status, ok := parseFlags(c, cmd, fs, args); !ok {
		return status
	}
	var err error
	if opts.state, err = normalizeState(*state); err != nil {
		return c.fail(cmd, err)
	}
	switch {
	case opts.batch < 1:
		return c.usageFailed(cmd, usagef("-batch %d: want at least 1", opts.batch))
	case opts.limit < 0:
		return c.usageFailed(cmd, usagef("-limit %d is negative", opts.limit))
	case opts.ttl <= 0:
		return c.usageFailed(cmd, usagef("-ttl %v: want a positive duration", opts.ttl))
	}
	return conn.connected(ctx, c, cmd, func(ctx context.Context, b backend) int {
		// The table is flushed every -batch rows, so that a long listing is
		// not held in memory: its columns are aligned within each batch.
		tw := newTabWriter(c.stdout)
		if !*asJSON {
			fmt.Fprintln(tw, "STORAGE KEY\tSTATE\tEPOCH\tAGE\tLEASE\tEXPIRES\tSTATUS\tBODY")
		}
		n := 0
		err := b.list(ctx, c, opts, func(r *record) error {
			if *asJSON {
				if err := writeJSON(c.stdout, r.json()); err != nil {
					return err
				}
			} else if writeRow(tw, r); (n+1)%opts.batch == 0 {
				if err := tw.Flush(); err != nil {
					return err
				}
			}
			n++
			if opts.limit > 0 && n >= opts.limit {
				return errLimit
			}
			return nil
		})
		if ferr := tw.Flush(); err == nil {
			err = ferr
		}
		if err != nil && !errors.Is(err, errLimit) {
			return c.fail(cmd, err)
		}
		if !opts.quiet {
			stopped := ""
			if errors.Is(err, errLimit) {
				stopped = fmt.Sprintf(", stopped at -limit %d", opts.limit)
			}
			fmt.Fprintf(c.stderr, "idemctl list: %d records%s (%s)\n", n, stopped, b.describe())
		}
		return exitOK
	})
}

// newTabWriter returns the writer of idemctl's tables: columns two spaces
// apart.
func newTabWriter(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

// writeRow writes r as one row of list's table to w, a tabwriter: its cells
// are graphic (see safe), so they hold no tab.
func writeRow(w io.Writer, r *record) {
	dash := func(d *time.Duration) string {
		if d == nil {
			return "-"
		}
		return human(*d)
	}
	lease := "-"
	if r.State == stateInProgress && r.LeaseLeft != nil {
		if *r.LeaseLeft > 0 {
			lease = "live " + human(*r.LeaseLeft)
		} else {
			lease = "ran out " + human(-*r.LeaseLeft)
		}
	}
	status, body := "-", "-"
	if r.Status != 0 {
		status = strconv.Itoa(r.Status)
		body = strconv.FormatInt(r.BodyLen, 10)
		if r.BodyOmitted {
			body = "omitted"
		}
	}
	state := r.State
	if r.Problem != "" {
		state += " (" + safe(r.Problem) + ")"
	}
	epoch := "-"
	if r.Epoch > 0 {
		epoch = strconv.FormatInt(r.Epoch, 10)
	}
	expires := dash(r.ExpiresIn)
	if r.ExpiresIn != nil && *r.ExpiresIn <= 0 {
		expires = "past"
	}
	fmt.Fprintln(w, strings.Join([]string{safe(r.Key), state, epoch, dash(r.Age), lease, expires, status, body}, "\t"))
}

// sleep pauses a scan for d between two batches (-pause), or returns ctx's
// error when ctx ends first.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// progressEvery is how often a long scan reports its progress on stderr.
var progressEvery = 2 * time.Second

// progress reports how far a scan went.
type progress struct {
	c       *cli
	quiet   bool
	what    string
	start   time.Time
	last    time.Time
	node    string
	scanned int64
	matched int64
	printed bool
}

func newProgress(c *cli, quiet bool, what string) *progress {
	now := time.Now()
	return &progress{c: c, quiet: quiet, what: what, start: now, last: now}
}

// tick reports the progress when progressEvery has passed since the last
// report (or the start).
func (p *progress) tick() {
	if p.quiet {
		return
	}
	if now := time.Now(); now.Sub(p.last) >= progressEvery {
		p.last, p.printed = now, true
		fmt.Fprintf(p.c.stderr, "idemctl: scanned %d %s (%d selected) in %s, now on %s\n",
			p.scanned, p.what, p.matched, human(now.Sub(p.start)), p.node)
	}
}

// done reports the end of a scan that reported progress.
func (p *progress) done() {
	if p.printed && !p.quiet {
		fmt.Fprintf(p.c.stderr, "idemctl: scan done: %d %s in %s\n", p.scanned, p.what, human(time.Since(p.start)))
	}
}
