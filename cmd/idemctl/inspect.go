package main

import (
	"context"
	"fmt"
)

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
	var conn connFlags
	var t target
	fs := newFlagSet(cmd, &conn, &t)
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
	return conn.connected(ctx, c, cmd, func(ctx context.Context, b backend) int {
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
	})
}
