package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/go-idempotency/idempotency/servercheck"
)

var checkCmd = &command{
	name:    "check",
	summary: "judge the server's (or SQLite file's) settings; exit status 1 when unsafe",
	usage:   "[connection] [-json] [-strict] [-v] [-purge-lag D]",
	help: `
Reads the server's (or the SQLite file's) settings and judges each: OK, WARN (a restart or failover
can lose records, so their keys can run again), FAIL (a duplicate can run a
handler a second time in ordinary operation, or the store cannot work), or
INFO (a fact, not judged). Exit status 1 when anything FAILs (with -strict,
also when anything WARNs) or when the check could not run, else 0. Under a
WARN or FAIL line a second line says why and what to do (-v: under every
line). A last line sums up: "safe", "safe, with warnings" or "UNSAFE", with
the counts. The check is package servercheck's (for an SQLite file,
sqlitestore.CheckFile), which an application can also run at start-up.

Redis: role (the node written to is a master), version (7 or later, for
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
expiry; WARN when older than -purge-lag) and the clock (INFO).

SQLite (-sqlite FILE, or SQLITE_PATH: sqlitestore's file): the file (it
exists: the check never creates it), journal_mode (WAL, which the file
stores, else FAIL), whether it can be written (query_only, and a write
rolled back: FAIL naming a read-only file, -wal or -shm file, or connection)
and its directory (where SQLite creates the -wal and -shm files), the table
with its columns and expires_at index, the purge (as PostgreSQL's),
quick_check (FAIL when the file is corrupt; it reads the whole file: raise
-timeout for a large one), and as INFO the SQLite version, the outbox's
messages by state, the size and free pages, and synchronous and busy_timeout: settings of each connection, not of
the file, which sqlitestore sets on every connection it opens
(synchronous=FULL, without which Open refuses to run). It writes nothing to
the database, and runs beside the application.`,
	examples: `  idemctl check -redis 127.0.0.1:6379
  idemctl check -sentinel 10.0.0.1:26379,10.0.0.2:26379 -master mymaster -strict
  idemctl check -redis 10.0.0.1:6379 -cluster -json | jq '.findings[] | select(.verdict != "OK")'
  idemctl check -postgres "$DATABASE_URL" -purge-lag 30m
  idemctl check -sqlite /var/lib/app/app.db -strict`,
	run: runCheck,
}

// checkOptions are check's thresholds.
type checkOptions struct {
	purgeLag time.Duration
}

func runCheck(ctx context.Context, c *cli, cmd *command, args []string) int {
	conn := connFlags{withSQLite: true}
	fs := newFlagSet(cmd, &conn)
	var opts checkOptions
	asJSON := fs.Bool("json", false, "print JSON")
	strict := fs.Bool("strict", false, "exit 1 on WARN too")
	verbose := fs.Bool("v", false, "explain every line, OK and INFO too")
	fs.DurationVar(&opts.purgeLag, "purge-lag", time.Hour, "PostgreSQL and SQLite: WARN when a row expired longer ago than this is still there")
	if status, ok := parseFlags(c, cmd, fs, args); !ok {
		return status
	}
	if opts.purgeLag < 0 {
		return c.usageFailed(cmd, usagef("-purge-lag %v is negative", opts.purgeLag))
	}
	return conn.checked(ctx, c, cmd, func(ctx context.Context, b checker) int {
		r, err := b.check(ctx, opts)
		if err != nil {
			return c.fail(cmd, err)
		}
		worst := r.Worst()
		if *asJSON {
			out := struct {
				Store    string                `json:"store"`
				Verdict  servercheck.Verdict   `json:"verdict"`
				Findings []servercheck.Finding `json:"findings"`
			}{b.describe(), worst, r.Findings}
			if code := c.printJSON(cmd, out); code != exitOK {
				return code
			}
		} else {
			writeReport(c.stdout, b.describe(), r, *verbose)
		}
		if worst == servercheck.Fail || (*strict && worst == servercheck.Warn) {
			return exitFailure
		}
		return exitOK
	})
}

// writeReport writes r for people: one line per finding, with the reason
// under WARN and FAIL (under every one when verbose), and a summary.
func writeReport(w io.Writer, store string, r servercheck.Report, verbose bool) {
	fmt.Fprintln(w, store)
	tw := newTabWriter(w)
	counts := map[servercheck.Verdict]int{}
	for _, f := range r.Findings {
		counts[f.Verdict]++
		node := ""
		if f.Node != "" {
			node = "  [" + f.Node + "]"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s%s\n", f.Verdict, f.Item, safe(f.Value), node)
		if verbose || f.Verdict >= servercheck.Warn {
			fmt.Fprintf(tw, "\t\t%s\n", safe(f.Detail))
		}
	}
	tw.Flush()
	summary := "safe"
	switch r.Worst() {
	case servercheck.Fail:
		summary = "UNSAFE"
	case servercheck.Warn:
		summary = "safe, with warnings"
	}
	fmt.Fprintf(w, "%s: %d FAIL, %d WARN, %d OK, %d INFO\n", summary,
		counts[servercheck.Fail], counts[servercheck.Warn], counts[servercheck.OK], counts[servercheck.Info])
}
