package main

import (
	"context"
	"errors"
	"fmt"
)

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
	var conn connFlags
	var t target
	fs := newFlagSet(cmd, &conn, &t)
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
	return conn.connected(ctx, c, cmd, func(ctx context.Context, b backend) int {
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
	})
}
