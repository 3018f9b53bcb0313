// Command idemctl inspects and repairs the records that the idempotency
// middleware keeps in Redis (redisstore) or PostgreSQL (pgstore), and the
// messages of the transactional outbox (package outbox), shows state
// records (package state), and checks that the server, or the SQLite file
// of sqlitestore, keeps them safely.
//
//	idemctl key     -scope user-42 -key 4b1c…            # scope + client key → storage key
//	idemctl inspect -redis 127.0.0.1:6379 -scope user-42 -key 4b1c…
//	idemctl list    -redis 127.0.0.1:6379 -state in_progress -older 30s
//	idemctl release -redis 127.0.0.1:6379 3f0c…e9
//	idemctl stats   -postgres "$DATABASE_URL"
//	idemctl check   -redis 127.0.0.1:6379               # exit status 1 when unsafe
//	idemctl check   -sqlite /var/lib/app/app.db         # an SQLite file of sqlitestore
//	idemctl outbox  -postgres "$DATABASE_URL"           # outbox messages by state, the relays' lag
//	idemctl outbox dead    -postgres "$DATABASE_URL"    # dead messages and why they died
//	idemctl outbox schedule -postgres "$DATABASE_URL" -in 1h 3f0c…e9/1
//	idemctl outbox cancel  -postgres "$DATABASE_URL" 3f0c…e9/1
//	idemctl outbox suspend -postgres "$DATABASE_URL" -topic payments.capture
//	idemctl outbox resume  -postgres "$DATABASE_URL" -topic payments.capture
//	idemctl outbox requeue -postgres "$DATABASE_URL" 3f0c…e9/1
//	idemctl outbox purge   -postgres "$DATABASE_URL" -done -older 72h
//	idemctl state   -postgres "$DATABASE_URL" -scope acme -machine payments.payment -id pay_123
//
// Run idemctl -h for the commands and idemctl <command> -h for each
// command's manual. RUNBOOK.md at the repository's root puts them to use.
//
// It is a module of its own, which requires sqlitestore for check -sqlite
// (so that the library's module does not depend on SQLite): install it
// with go install github.com/go-idempotency/idempotency/cmd/idemctl@latest,
// or in a clone of the repository run go run ./cmd/idemctl (go.work makes
// one workspace of the modules).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// Exit statuses.
const (
	exitOK       = 0 // done
	exitFailure  = 1 // an error, or check found something unsafe
	exitUsage    = 2 // bad flags or arguments
	exitNotFound = 3 // no such record
	exitRefused  = 4 // a safety rule refused the change (see -force)
)

func main() {
	// go-redis logs dial failures and Sentinel events of its own; idemctl
	// reports errors itself.
	redis.SetLogger(quietLogger{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// quietLogger drops go-redis's log lines.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// cli is what a command runs with: its output streams and its environment.
type cli struct {
	stdout, stderr io.Writer
	getenv         func(string) string
}

// command is one subcommand of idemctl.
type command struct {
	name, summary string
	// usage is the synopsis after "idemctl name"; help explains the command
	// and examples shows it at work, both printed by -h.
	usage, help, examples string
	run                   func(ctx context.Context, c *cli, cmd *command, args []string) int
}

var commands []*command

func init() {
	commands = []*command{keyCmd, inspectCmd, listCmd, deleteCmd, releaseCmd, statsCmd, checkCmd, outboxCmd, stateCmd}
}

const topUsage = `idemctl inspects and repairs the records of the idempotency middleware in
Redis (redisstore) and PostgreSQL (pgstore), and the messages of its outbox,
and checks that the server, or the SQLite file of sqlitestore, keeps them
safely.

Usage:
  idemctl <command> [flags] [storage key]

Commands:
%s
Connection (flags of every command but key, of which outbox and state take
-postgres, -table and -timeout, and check alone -sqlite; a flag wins over the
environment):
  -redis ADDR|URL     Redis: host:port or redis://[user:password@]host:port[/db]
                      (environment: REDIS_URL, then REDIS_ADDR; REDIS_PASSWORD)
  -cluster            -redis names the seed nodes of a Redis Cluster, comma-separated
  -sentinel ADDRS     Redis behind Sentinel: the sentinels, comma-separated, with -master NAME
  -postgres URL       PostgreSQL: a connection string (environment: DATABASE_URL)
  -sqlite FILE        check: the SQLite file of sqlitestore (environment: SQLITE_PATH)
  -prefix P           the redisstore prefix (default "idempotency:")
  -table T            the pgstore table (default idempotency_records; check
                      -sqlite: the sqlitestore table, the same default; outbox:
                      the outbox table, default idempotency_outbox; state: the
                      state records' table, default idempotency_state)
  -timeout D          give up after D (default 30s; 0 never)

A record is named by -scope and -key (what the middleware's key scope returned
and the client's Idempotency-Key), or by its storage key (the key_hash of the
middleware's logs and events), or by its Redis key.

Exit status:
  0  done
  1  an error, or check found an unsafe setting
  2  bad flags or arguments
  3  no such record (outbox: no such message)
  4  a safety rule refused the change (see -force)

Run 'idemctl <command> -h' for a command's manual. RUNBOOK.md puts them to use.
`

// printTopUsage writes the top-level help to w.
func printTopUsage(w io.Writer) {
	var b strings.Builder
	for _, c := range commands {
		fmt.Fprintf(&b, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, topUsage, b.String())
}

// run runs idemctl with args (without the program's name) and returns its
// exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	c := &cli{stdout: stdout, stderr: stderr, getenv: getenv}
	if len(args) == 0 {
		printTopUsage(stderr)
		return exitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		if len(args) > 1 && args[0] == "help" {
			if cmd := lookup(args[1]); cmd != nil {
				return cmd.run(ctx, c, cmd, []string{"-h"})
			}
		}
		printTopUsage(stdout)
		return exitOK
	}
	cmd := lookup(args[0])
	if cmd == nil {
		fmt.Fprintf(stderr, "idemctl: unknown command %q; run 'idemctl -h' for the list\n", args[0])
		return exitUsage
	}
	return cmd.run(ctx, c, cmd, args[1:])
}

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// flagGroup is a group of flags that several commands share: connFlags,
// target.
type flagGroup interface{ register(fs *flag.FlagSet) }

// newFlagSet returns a flag set for cmd with the flags of groups, which
// reports nothing itself: parse prints help and errors.
func newFlagSet(cmd *command, groups ...flagGroup) *flag.FlagSet {
	fs := flag.NewFlagSet("idemctl "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	for _, g := range groups {
		g.register(fs)
	}
	return fs
}

// printCommandUsage writes cmd's manual and fs's flags to w.
func printCommandUsage(w io.Writer, cmd *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: idemctl %s %s\n\n%s\n", cmd.name, cmd.usage, strings.TrimSpace(cmd.help))
	fmt.Fprintf(w, "\nFlags:\n")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
	if cmd.examples != "" {
		fmt.Fprintf(w, "\nExamples:\n%s\n", strings.TrimRight(cmd.examples, "\n"))
	}
}

// usageError is a mistake in the command line.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// parse parses args with fs, allowing flags after positional arguments,
// and returns the positional ones. -h prints cmd's manual to stdout; it and
// errors are reported through the returned status (ok false).
func parse(c *cli, cmd *command, fs *flag.FlagSet, args []string) (pos []string, status int, ok bool) {
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				printCommandUsage(c.stdout, cmd, fs)
				return nil, exitOK, false
			}
			return nil, c.usageFailed(cmd, err), false
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, exitOK, true
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// parseFlags is parse for a command that takes no argument.
func parseFlags(c *cli, cmd *command, fs *flag.FlagSet, args []string) (status int, ok bool) {
	pos, status, ok := parse(c, cmd, fs, args)
	if ok && len(pos) > 0 {
		return c.usageFailed(cmd, usagef("unexpected argument %q", pos[0])), false
	}
	return status, ok
}

// usageFailed reports a usage error of cmd and returns exitUsage.
func (c *cli) usageFailed(cmd *command, err error) int {
	fmt.Fprintf(c.stderr, "idemctl %s: %v\nRun 'idemctl %s -h' for usage.\n", cmd.name, err, cmd.name)
	return exitUsage
}

// fail reports err for cmd and returns its exit status: exitUsage for a
// usageError, exitFailure otherwise.
func (c *cli) fail(cmd *command, err error) int {
	var ue usageError
	if errors.As(err, &ue) {
		return c.usageFailed(cmd, err)
	}
	fmt.Fprintf(c.stderr, "idemctl %s: %s\n", cmd.name, safe(err.Error()))
	return exitFailure
}
