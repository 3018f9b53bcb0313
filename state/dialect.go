package state

import (
	"fmt"
	"strings"

	"github.com/go-idempotency/idempotency/outbox/lifecycle"
)

// Dialect is what varies between database engines in the statements of a
// Store: each operation's logic and SQL template are written once (see
// sql.go), and a Dialect supplies the fragments of the template that one
// engine writes its own way, as lifecycle.Dialect does for the outbox's.
// Types are named as PostgreSQL names them (text, bigint, integer, bytea,
// json); a dialect renders them as its engine needs, or leaves them out.
//
// PostgreSQL and SQLite are the dialects. Another engine is another
// Dialect value (NewDB), not another copy of the operations.
type Dialect struct {
	// Name names the engine, for errors.
	Name string
	// Param renders the placeholder of the statement's parameter n (from
	// 1), of type typ.
	Param func(n int, typ string) string
	// Cast renders the expression expr converted to the type typ.
	Cast func(expr, typ string) string
	// Now is the expression of the database server's clock, read anew by
	// each statement.
	Now string
	// Notify renders the expression that wakes the relays waiting on the
	// channel named channel once the transaction commits; nil when the
	// engine cannot (the relays then find the events when they poll).
	Notify func(channel string) string
	// Outbox is the outbox table's dialect on the same engine, which
	// writes the events.
	Outbox lifecycle.Dialect
	// Steps is set for an engine without data-modifying WITH queries: a
	// transition runs as three statements (the compare-and-swap, the
	// history's row, the event) in one transaction (lifecycle.InTx),
	// instead of one.
	Steps bool
}

// PostgreSQL is the dialect of PostgreSQL, through pgx: parameters $n with
// a cast to their type, clock_timestamp(), pg_notify.
var PostgreSQL = Dialect{
	Name:  "postgresql",
	Param: func(n int, typ string) string { return fmt.Sprintf("$%d::%s", n, typ) },
	Cast:  func(expr, typ string) string { return fmt.Sprintf("(%s)::%s", expr, typ) },
	Now:   "clock_timestamp()",
	Notify: func(channel string) string {
		return fmt.Sprintf("pg_notify(%s, '')", literal(channel))
	},
	Outbox: lifecycle.PostgreSQL,
}

// literal quotes s as an SQL string literal.
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
