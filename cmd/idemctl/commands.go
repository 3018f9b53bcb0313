package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-idempotency/idempotency/redisstore"
)

var keyCmd = &command{
	name:    "key",
	summary: "scope + client key → storage key, Redis key and table row",
	usage:   "[-scope SCOPE] -key KEY [-prefix P] [-table T] [-json]",
	help: `
Computes where the middleware keeps the record of a request: the storage key
idempotency.StorageKey(scope, key), a hex SHA-256 of the scope and the client's
key, which is also the key_hash of the middleware's logs and events; the Redis
key (the redisstore prefix and the storage key); and the pgstore row (the table
and its key column). It needs no connection.

-key is the Idempotency-Key header's value as the client sent it: a bare token
(abc) or a quoted string ("abc", with \" and \\ escapes); it is parsed as the
middleware parses it. -scope is what the route's idempotency.WithKeyScope
function returned for the request (the user or tenant); leave it out for
routes without one.`,
	examples: `  idemctl key -scope user-42 -key 8e03978e-40d5-43e8-bc93-6894a57f9324
  idemctl key -key '"order-1001"' -prefix payments-api:idem:
  idemctl key -scope tenant-7 -key abc -json | jq -r .redis_key`,
	run: runKey,
}

func runKey(_ context.Context, c *cli, cmd *command, args []string) int {
	fs := newFlagSet(cmd, c)
	var t target
	t.register(fs)
	prefix := fs.String("prefix", defaultPrefix, "the redisstore key `prefix`")
	table := fs.String("table", "idempotency_records", "the pgstore `table`")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, status, ok := parse(c, cmd, fs, args)
	if !ok {
		return status
	}
	if !t.keySet {
		return c.usageFailed(cmd, usagef("-key is required"))
	}
	key, err := t.storageKey(pos, *prefix)
	if err != nil {
		return c.fail(cmd, err)
	}
	tb, err := parseTable(*table)
	if err != nil {
		return c.fail(cmd, usagef("%v", err))
	}
	out := struct {
		Scope      string `json:"scope"`
		Key        string `json:"key"`
		StorageKey string `json:"storage_key"`
		RedisKey   string `json:"redis_key"`
		Channel    string `json:"redis_channel"`
		Table      string `json:"postgres_table"`
		SQL        string `json:"postgres_query"`
	}{
		Scope: t.scope, Key: t.key, StorageKey: key,
		RedisKey: *prefix + key, Channel: *prefix + key + ":changed",
		Table: tb.name, SQL: fmt.Sprintf("SELECT * FROM %s WHERE key = '%s';", tb.quoted, key),
	}
	if *asJSON {
		return c.printJSON(cmd, out)
	}
	fmt.Fprintf(c.stdout, "scope          %s\n", strconvQuote(out.Scope))
	fmt.Fprintf(c.stdout, "key            %s\n", strconvQuote(out.Key))
	fmt.Fprintf(c.stdout, "storage key    %s\n", out.StorageKey)
	fmt.Fprintf(c.stdout, "redis key      %s\n", out.RedisKey)
	fmt.Fprintf(c.stdout, "redis channel  %s\n", out.Channel)
	fmt.Fprintf(c.stdout, "postgres       %s\n", out.SQL)
	return exitOK
}

func strconvQuote(s string) string { return fmt.Sprintf("%q", s) }

var inspectCmd = &command{
	name:    "inspect",
	summary: "show one record decoded: state, epoch, lease, TTL, response",
	usage:   "[connection] (-scope SCOPE -key KEY | STORAGE-KEY) [-body N] [-json]",
	help: `
Reads one record and shows it decoded: its state (in_progress or complete;
corrupt when the store could not read it, with the reason; on PostgreSQL
expired for a row past its expiry that the purge has not deleted yet), its
epoch (1, plus one per steal), its lease token, the request fingerprint, its
lease (live and how long is left, or how long ago it ran out, on the server's
clock), how long until Redis or the purge removes it (for a complete record,
the TTL left), whether a waiter watches it, and for a complete record the
stored status, headers and the first bytes of the body (-body).

A UTF-8 body is shown line by line after "|", with its tabs expanded; a line
holding a control or format character (a carriage return, an escape, a bidi
control, a line separator...) is shown Go-quoted after "!" instead. A body
that is not UTF-8, or holds a NUL byte, is shown as a hex dump. Header names
and values, keys, tokens and reasons holding such characters are Go-quoted
too, and -json writes them as \uXXXX escapes.

It only reads. Exit status 3 when there is no record.`,
	examples: `  idemctl inspect -redis 127.0.0.1:6379 -scope user-42 -key 8e03978e-40d5-43e8-bc93-6894a57f9324
  idemctl inspect -redis 127.0.0.1:6379 3f0c5a2be0f1cb0a2b5cf4c1d5b6f1e2a1c1f5d7e8e9f0a1b2c3d4e5f6a7b8c9
  idemctl inspect -postgres "$DATABASE_URL" -key abc -body 4096 -json | jq .headers`,
	run: runInspect,
}

func runInspect(ctx context.Context, c *cli, cmd *command, args []string) int {
	fs := newFlagSet(cmd, c)
	var conn connFlags
	conn.register(fs)
	var t target
	t.register(fs)
	bodyLimit := fs.Int("body", 512, "show at most `n` bytes of the body (0: none)")
	asJSON := fs.Bool("json", false, "print JSON (the body preview as body_preview_base64, and as body_preview when it is UTF-8)")
	pos, status, ok := parse(c, cmd, fs, args)
	if !ok {
		return status
	}
	if *bodyLimit < 0 {
		return c.usageFailed(cmd, usagef("-body %d is negative", *bodyLimit))
	}
	key, err := t.storageKey(pos, conn.prefix)
	if err != nil {
		return c.fail(cmd, err)
	}
	ctx, cancel := conn.context(ctx)
	defer cancel()
	b, err := conn.open(ctx, c)
	if err != nil {
		return c.fail(cmd, err)
	}
	defer b.close()
	rec, err := b.inspect(ctx, key, *bodyLimit)
	if err != nil {
		return c.fail(cmd, err)
	}
	if rec == nil {
		fmt.Fprintf(c.stderr, "idemctl inspect: no record at %s (%s)\n", b.location(key), b.describe())
		return exitNotFound
	}
	if *asJSON {
		return c.printJSON(cmd, rec.json())
	}
	rec.writeText(c.stdout)
	return exitOK
}

var deleteCmd = &command{
	name:    "delete",
	summary: "delete a record (COMPLETE, unreadable or running: only with -force)",
	usage:   "[connection] (-scope SCOPE -key KEY | STORAGE-KEY) [-force] [-epoch N] [-json]",
	help: `
Deletes one record, so that the next request with its key runs the handler
as a first request. Without -force it deletes only a record whose handler
cannot be running: an IN_PROGRESS record whose lease ran out (on PostgreSQL
also an expired row). It refuses, with exit status 4:

  - a COMPLETE record: deleting it makes the next duplicate run the handler
    again instead of replaying the stored response;
  - an unreadable (corrupt) record: requests for it get 500 record_unreadable;
    deleting it lets the next one run the handler;
  - an IN_PROGRESS record whose lease is live: its handler may be running,
    and a duplicate would run beside it.

-force deletes them anyway: use it only once you know what the record's
handler did (see RUNBOOK.md). -epoch N deletes only a record still at epoch
N, as inspect showed it. The record is deleted only if it has not changed
since it was judged; waiters watching it are woken. Exit status 3 when there
is no record.`,
	examples: `  idemctl delete -redis 127.0.0.1:6379 -scope user-42 -key abc
  idemctl delete -redis 127.0.0.1:6379 -force -epoch 1 3f0c5a2be0f1cb0a2b5cf4c1d5b6f1e2a1c1f5d7e8e9f0a1b2c3d4e5f6a7b8c9
  idemctl delete -postgres "$DATABASE_URL" -key abc -force`,
	run: runRemove,
}

var releaseCmd = &command{
	name:    "release",
	summary: "release a stuck IN_PROGRESS record (lease ran out, or -force)",
	usage:   "[connection] (-scope SCOPE -key KEY | STORAGE-KEY) [-force] [-epoch N] [-json]",
	help: `
Releases an IN_PROGRESS record as the middleware does after a 5xx or a panic:
the record is deleted and waiters are woken, so the next request with the key
runs the handler. It never touches a COMPLETE or unreadable record (use
delete). Without -force it releases only a record whose lease ran out; a live
lease means the handler may still be running (or hung while its heartbeat
goes on), and releasing would let a duplicate run beside it: that is refused
with exit status 4 unless -force is given. -epoch N releases only a record
still at epoch N. Exit status 3 when there is no record.`,
	examples: `  idemctl list -redis 127.0.0.1:6379 -state in_progress -older 10m
  idemctl release -redis 127.0.0.1:6379 -epoch 2 3f0c5a2be0f1cb0a2b5cf4c1d5b6f1e2a1c1f5d7e8e9f0a1b2c3d4e5f6a7b8c9
  idemctl release -postgres "$DATABASE_URL" -scope user-42 -key abc -force`,
	run: runRemove,
}

func runRemove(ctx context.Context, c *cli, cmd *command, args []string) int {
	fs := newFlagSet(cmd, c)
	var conn connFlags
	conn.register(fs)
	var t target
	t.register(fs)
	rule := removal{release: cmd.name == "release"}
	if rule.release {
		fs.BoolVar(&rule.force, "force", false, "release even while the lease is live (never a COMPLETE record)")
	} else {
		fs.BoolVar(&rule.force, "force", false, "delete a COMPLETE or unreadable record, or one with a live lease")
	}
	fs.Int64Var(&rule.epoch, "epoch", 0, "act only while the record is at epoch `n` (0: any)")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, status, ok := parse(c, cmd, fs, args)
	if !ok {
		return status
	}
	key, err := t.storageKey(pos, conn.prefix)
	if err != nil {
		return c.fail(cmd, err)
	}
	ctx, cancel := conn.context(ctx)
	defer cancel()
	b, err := conn.open(ctx, c)
	if err != nil {
		return c.fail(cmd, err)
	}
	defer b.close()
	rec, err := b.remove(ctx, key, rule)
	switch {
	case errors.Is(err, errNotFound):
		fmt.Fprintf(c.stderr, "idemctl %s: no record at %s (%s)\n", cmd.name, b.location(key), b.describe())
		return exitNotFound
	case errors.Is(err, errRefused):
		fmt.Fprintf(c.stderr, "idemctl %s: %s: %v\n", cmd.name, b.location(key), err)
		return exitRefused
	case err != nil:
		return c.fail(cmd, err)
	}
	verb := "deleted"
	if rule.release {
		verb = "released"
	}
	if *asJSON {
		out := struct {
			Action string     `json:"action"`
			Record recordJSON `json:"record"`
		}{verb, rec.json()}
		return c.printJSON(cmd, out)
	}
	what := rec.State
	if rec.Epoch > 0 {
		what += fmt.Sprintf(", epoch %d", rec.Epoch)
	}
	if rec.State == stateInProgress && rec.LeaseLeft != nil {
		if left := *rec.LeaseLeft; left > 0 {
			what += ", lease live, " + human(left) + " left"
		} else {
			what += ", lease ran out " + human(-left) + " ago"
		}
	}
	fmt.Fprintf(c.stdout, "%s %s (%s)\n", verb, b.location(key), what)
	return exitOK
}

// defaultTTL is the middleware's default TTL (idempotency.WithTTL).
const defaultTTL = 24 * time.Hour

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
0) for a large keyspace. -json prints one JSON object per line.`,
	examples: `  idemctl list -redis 127.0.0.1:6379 -state in_progress -older 30s
  idemctl list -redis 10.0.0.1:6379,10.0.0.2:6379 -cluster -state complete -limit 20
  idemctl list -postgres "$DATABASE_URL" -state in_progress -older 10m -ttl 1h -json | jq -r .storage_key
  idemctl list -redis 127.0.0.1:6379 -batch 500 -pause 10ms -limit 0 -q > records.txt`,
	run: runList,
}

func runList(ctx context.Context, c *cli, cmd *command, args []string) int {
	fs := newFlagSet(cmd, c)
	var conn connFlags
	conn.register(fs)
	var opts listOptions
	state := fs.String("state", "all", "`state`: in_progress, complete, corrupt, expired or all")
	fs.DurationVar(&opts.older, "older", 0, "only records at least this `duration` old (see -ttl)")
	fs.DurationVar(&opts.ttl, "ttl", defaultTTL, "the routes' TTL, from which ages are computed")
	fs.IntVar(&opts.limit, "limit", 1000, "stop after `n` records (0: no limit)")
	fs.IntVar(&opts.batch, "batch", 1000, "`n` keys per SCAN (COUNT), or rows per page")
	fs.DurationVar(&opts.pause, "pause", 0, "pause this `duration` between batches")
	fs.BoolVar(&opts.quiet, "q", false, "no progress or summary on stderr")
	asJSON := fs.Bool("json", false, "print one JSON object per record and line")
	pos, status, ok := parse(c, cmd, fs, args)
	if !ok {
		return status
	}
	if len(pos) > 0 {
		return c.usageFailed(cmd, usagef("unexpected argument %q", pos[0]))
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
	ctx, cancel := conn.context(ctx)
	defer cancel()
	b, err := conn.open(ctx, c)
	if err != nil {
		return c.fail(cmd, err)
	}
	defer b.close()
	if !*asJSON {
		fmt.Fprintf(c.stdout, "%-64s  %-11s %5s  %-9s %-18s %-10s %6s %s\n",
			"STORAGE KEY", "STATE", "EPOCH", "AGE", "LEASE", "EXPIRES", "STATUS", "BODY")
	}
	n := 0
	err = b.list(ctx, c, opts, func(r *record) error {
		if *asJSON {
			if err := writeJSON(c.stdout, r.json()); err != nil {
				return err
			}
		} else {
			writeRow(c, r)
		}
		n++
		if opts.limit > 0 && n >= opts.limit {
			return errLimit
		}
		return nil
	})
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
}

// writeRow writes r as one line of list's table.
func writeRow(c *cli, r *record) {
	dash := func(d *time.Duration) string {
		if d == nil {
			return "-"
		}
		return short(*d)
	}
	lease := "-"
	if r.State == stateInProgress && r.LeaseLeft != nil {
		if *r.LeaseLeft > 0 {
			lease = "live " + short(*r.LeaseLeft)
		} else {
			lease = "ran out " + short(-*r.LeaseLeft)
		}
	}
	status, body := "-", "-"
	if r.Status != 0 {
		status = fmt.Sprint(r.Status)
		body = fmt.Sprint(r.BodyLen)
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
		epoch = fmt.Sprint(r.Epoch)
	}
	expires := dash(r.ExpiresIn)
	if r.ExpiresIn != nil && *r.ExpiresIn <= 0 {
		expires = "past"
	}
	fmt.Fprintf(c.stdout, "%-64s  %-11s %5s  %-9s %-18s %-10s %6s %s\n",
		safe(r.Key), state, epoch, dash(r.Age), lease, expires, status, body)
}

// short renders d in at most a few characters: 850ms, 12s, 5m3s, 23h59m.
func short(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		d = d.Round(time.Second)
	default:
		d = d.Round(time.Minute)
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	return s
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

var statsCmd = &command{
	name:    "stats",
	summary: "count records by state, with their memory or table size",
	usage:   "[connection] [-sample N] [-batch N] [-pause D] [-json] [-q]",
	help: `
Counts the records by state: in progress with a live lease, in progress with
a lease that ran out (the next duplicate steals them), complete, corrupt, and
on PostgreSQL expired rows that the purge has not deleted yet; with the bytes
of their bodies and the memory they take.

Redis: every key under the prefix is read with SCAN in bounded batches (as
list does), and MEMORY USAGE measures the first -sample records of each state;
a state's memory is its average over the sample times its count. The masters'
used_memory and maxmemory follow.

PostgreSQL: one query counts the rows by state with their bytes
(pg_column_size), and the table's size on disk follows: the heap, its TOAST
table (large bodies) and indexes (pg_total_relation_size).`,
	examples: `  idemctl stats -redis 127.0.0.1:6379
  idemctl stats -redis 127.0.0.1:6379 -sample 5000 -json
  idemctl stats -postgres "$DATABASE_URL" -table billing.idempotency`,
	run: runStats,
}

// statsOptions are stats' sampling and pacing.
type statsOptions struct {
	sample int
	batch  int
	pause  time.Duration
	quiet  bool
}

func runStats(ctx context.Context, c *cli, cmd *command, args []string) int {
	fs := newFlagSet(cmd, c)
	var conn connFlags
	conn.register(fs)
	var opts statsOptions
	fs.IntVar(&opts.sample, "sample", 1000, "Redis: measure MEMORY USAGE of at most `n` records per state")
	fs.IntVar(&opts.batch, "batch", 1000, "Redis: `n` keys per SCAN (COUNT)")
	fs.DurationVar(&opts.pause, "pause", 0, "Redis: pause this `duration` between batches")
	fs.BoolVar(&opts.quiet, "q", false, "no progress on stderr")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, status, ok := parse(c, cmd, fs, args)
	if !ok {
		return status
	}
	if len(pos) > 0 {
		return c.usageFailed(cmd, usagef("unexpected argument %q", pos[0]))
	}
	if opts.batch < 1 || opts.sample < 0 {
		return c.usageFailed(cmd, usagef("-batch must be at least 1 and -sample not negative"))
	}
	ctx, cancel := conn.context(ctx)
	defer cancel()
	b, err := conn.open(ctx, c)
	if err != nil {
		return c.fail(cmd, err)
	}
	defer b.close()
	res, err := b.stats(ctx, c, opts)
	if err != nil {
		return c.fail(cmd, err)
	}
	if *asJSON {
		return c.printJSON(cmd, res)
	}
	res.writeText(c.stdout)
	return exitOK
}

var checkCmd = &command{
	name:    "check",
	summary: "judge the server's settings; exit status 1 when unsafe",
	usage:   "[connection] [-json] [-strict] [-v] [-purge-lag D]",
	help: `
Reads the server's settings and judges each: OK, WARN (a restart or failover
can lose records, so their keys can run again), FAIL (a duplicate can run a
handler a second time in ordinary operation, or the store cannot work), or
INFO (a fact, not judged). Exit status 1 when anything FAILs (with -strict,
also when anything WARNs) or when the check could not run, else 0. WARN and
FAIL lines say why and what to do; -v says it for every line. A last line
sums up: "safe", "safe, with warnings" or "UNSAFE", with the counts.

Redis (the check of redisstore's Store.Check, which redisstore.New also runs
at start-up and logs): role (the node written to is a master), version (7 or later, for
allow-oom scripts), maxmemory-policy (noeviction, else FAIL), maxmemory (set,
below 90% used), persistence (AOF with appendfsync everysec or always; RDB
only or nothing: WARN), replication (on a master with replicas or behind
Sentinel: min-replicas-to-write at least 1, and fewer than its replicas),
clock (the server's against this host's: INFO), and on a Cluster the state,
slot coverage (every slot has a live master, else FAIL), every master with a
live replica, every node's settings, and the spread of the nodes' clocks.

PostgreSQL: version (12 or later), recovery (not a standby), the table with
its columns, primary key and expires_at index, fsync, full_page_writes,
synchronous_commit and replication (asynchronous standbys lose the last
commits on failover), idle_in_transaction_session_timeout (as this
connection's role sees it), autovacuum, the purge (the oldest row past its
expiry; WARN when older than -purge-lag) and the clock (INFO).`,
	examples: `  idemctl check -redis 127.0.0.1:6379
  idemctl check -sentinel 10.0.0.1:26379,10.0.0.2:26379 -master mymaster -strict
  idemctl check -redis 10.0.0.1:6379 -cluster -json | jq '.findings[] | select(.verdict != "OK")'
  idemctl check -postgres "$DATABASE_URL" -purge-lag 30m`,
	run: runCheck,
}

// checkOptions are check's thresholds.
type checkOptions struct {
	purgeLag time.Duration
}

func runCheck(ctx context.Context, c *cli, cmd *command, args []string) int {
	fs := newFlagSet(cmd, c)
	var conn connFlags
	conn.register(fs)
	var opts checkOptions
	asJSON := fs.Bool("json", false, "print JSON")
	strict := fs.Bool("strict", false, "exit 1 on WARN too")
	verbose := fs.Bool("v", false, "explain every line, OK and INFO too")
	fs.DurationVar(&opts.purgeLag, "purge-lag", time.Hour, "PostgreSQL: WARN when a row expired longer ago than this is still there")
	pos, status, ok := parse(c, cmd, fs, args)
	if !ok {
		return status
	}
	if len(pos) > 0 {
		return c.usageFailed(cmd, usagef("unexpected argument %q", pos[0]))
	}
	ctx, cancel := conn.context(ctx)
	defer cancel()
	b, err := conn.open(ctx, c)
	if err != nil {
		return c.fail(cmd, err)
	}
	defer b.close()
	r, err := b.check(ctx, opts)
	if err != nil {
		return c.fail(cmd, err)
	}
	worst := r.Worst()
	if *asJSON {
		out := struct {
			Store    string               `json:"store"`
			Verdict  redisstore.Verdict   `json:"verdict"`
			Findings []redisstore.Finding `json:"findings"`
		}{b.describe(), worst, r.Findings}
		if err := writeJSON(c.stdout, out); err != nil {
			return c.fail(cmd, err)
		}
	} else {
		writeReport(c, b.describe(), r, *verbose)
	}
	if worst == redisstore.Fail || (*strict && worst == redisstore.Warn) {
		return exitFailure
	}
	return exitOK
}

// writeReport writes r for people: one line per finding, with the reason
// under WARN and FAIL (under every one when verbose), and a summary.
func writeReport(c *cli, store string, r redisstore.Report, verbose bool) {
	fmt.Fprintf(c.stdout, "%s\n", store)
	counts := map[redisstore.Verdict]int{}
	for _, f := range r.Findings {
		counts[f.Verdict]++
		node := ""
		if f.Node != "" {
			node = "  [" + f.Node + "]"
		}
		fmt.Fprintf(c.stdout, "%-4s  %-18s %s%s\n", f.Verdict, f.Item, safe(f.Value), node)
		if verbose || f.Verdict >= redisstore.Warn {
			fmt.Fprintf(c.stdout, "      %s\n", f.Detail)
		}
	}
	summary := "safe"
	switch r.Worst() {
	case redisstore.Fail:
		summary = "UNSAFE"
	case redisstore.Warn:
		summary = "safe, with warnings"
	}
	fmt.Fprintf(c.stdout, "%s: %d FAIL, %d WARN, %d OK, %d INFO\n", summary,
		counts[redisstore.Fail], counts[redisstore.Warn], counts[redisstore.OK], counts[redisstore.Info])
}
