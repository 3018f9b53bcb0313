package lifecycle

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Dialect is what varies between database engines in the statements of a
// Table: each edge's logic and SQL template are written once, and a
// Dialect supplies the fragments of the template that one engine writes
// its own way. Types are named as PostgreSQL names them (text, bigint,
// integer, bytea, boolean, interval, timestamptz); a dialect renders them
// as its engine needs, or leaves them out.
//
// PostgreSQL and SQLite are the dialects. Another engine is another
// Dialect value, not another copy of the edges.
type Dialect struct {
	// Name names the engine, for errors.
	Name string
	// Param renders the placeholder of the statement's parameter n (from
	// 1), of type typ.
	Param func(n int, typ string) string
	// Now is the expression of the database server's clock, read anew by
	// each statement.
	Now string
	// Shift renders the time expression t moved by the duration bound to
	// parameter n: later when sign is 1, earlier when it is -1.
	Shift func(t string, n, sign int) string
	// Seconds renders the time from the time expression from to the time
	// expression to, in seconds, as a floating-point number (NULL when
	// either is NULL).
	Seconds func(from, to string) string
	// SkipLocked renders the clause that locks the rows of alias that a
	// SELECT reads, skipping those another transaction holds ("" where
	// the engine locks otherwise).
	SkipLocked func(alias string) string
	// Lock renders the clause that locks the rows of alias that a SELECT
	// reads, waiting for the transactions that hold them.
	Lock func(alias string) string
	// InList renders the condition that the expression expr is in the
	// list bound to parameter n, whose elements are of type typ.
	InList func(expr string, n int, typ string) string
	// InSelect renders the start of the condition that the expression
	// expr is among the values of a sub-select, whose text follows, closed
	// by EndInSelect.
	InSelect func(expr string) string
	// EndInSelect closes the condition InSelect opened.
	EndInSelect string
	// InPairs renders the condition that the pair of expressions (a, b)
	// is among the pairs of the lists bound to parameters n (of type ta)
	// and n+1 (of type tb), element by element.
	InPairs func(a, b string, n int, ta, tb string) string
	// Rows renders a row source named alias with one row per index of the
	// lists bound to cols, each list's element in the column named after
	// it, and the index (from 1) in the column i.
	Rows func(alias string, cols []Column) string
	// JSON renders the text expression expr as the engine's JSON value.
	JSON func(expr string) string
	// List turns a Go slice into the value bound to a list parameter.
	List func(v any) any
	// Arg converts a value bound to a parameter (a time.Time, a
	// time.Duration...) to what the engine's database/sql driver takes
	// (see SQL); nil where the driver takes them as they are.
	Arg func(v any) any
	// Time reads a time as the engine's driver returns it; nil where it
	// returns a time.Time.
	Time func(v any) (time.Time, error)
	// KeyLocks is the statement that makes the transactions enqueueing
	// messages of the same ordering keys wait for one another: $1 is the
	// table's name, $2 the keys, sorted. "" when the engine has no such
	// lock (it serializes every write transaction).
	KeyLocks string
	// Notify is the statement that wakes the relays waiting on the
	// channel $1 when the transaction commits; "" when the engine cannot.
	Notify string
	// UniqueViolation reports whether err is the engine's refusal of a
	// row that breaks a unique index.
	UniqueViolation func(err error) bool
}

// shiftOp is the operator of Dialect.Shift's sign.
func shiftOp(sign int) string {
	if sign < 0 {
		return "-"
	}
	return "+"
}

// time reads a time the engine's driver returned.
func (d Dialect) time(v any) (time.Time, error) {
	if d.Time != nil {
		return d.Time(v)
	}
	switch v := v.(type) {
	case time.Time:
		return v, nil
	case string: // pgx's infinity and -infinity
		return time.Time{}, fmt.Errorf("is not a finite time: %s", v)
	}
	return time.Time{}, errNotA("time", v)
}

// Column is a list parameter of Dialect.Rows: the column Name takes the
// elements of the list bound to parameter Param, of type Type.
type Column struct {
	Name  string
	Param int
	Type  string
}

// PostgreSQL is the dialect of PostgreSQL, through pgx: parameters $n with
// a cast to their type, clock_timestamp(), intervals, FOR UPDATE SKIP
// LOCKED, lists bound as arrays (= ANY, unnest), advisory locks and
// pg_notify.
var PostgreSQL = Dialect{
	Name:  "postgresql",
	Param: func(n int, typ string) string { return fmt.Sprintf("$%d::%s", n, typ) },
	Now:   "clock_timestamp()",
	Shift: func(t string, n, sign int) string {
		return fmt.Sprintf("(%s %s $%d::interval)", t, shiftOp(sign), n)
	},
	Seconds: func(from, to string) string {
		return fmt.Sprintf("extract(epoch FROM (%s) - (%s))::float8", to, from)
	},
	SkipLocked: func(alias string) string { return "FOR UPDATE OF " + alias + " SKIP LOCKED" },
	Lock:       func(alias string) string { return "FOR UPDATE OF " + alias },
	InList: func(expr string, n int, typ string) string {
		return fmt.Sprintf("%s = ANY ($%d::%s[])", expr, n, typ)
	},
	// The sub-select's values are gathered into an array before the rows
	// they name are looked up, by expr's index: the plan of "expr IN
	// (sub-select)" depends on the planner's estimate of the sub-select,
	// and a table whose statistics are stale (a backlog that grew since
	// the last ANALYZE) may have every row of the table read to find a
	// batch's.
	InSelect:    func(expr string) string { return expr + " = ANY (ARRAY(" },
	EndInSelect: "))",
	InPairs: func(a, b string, n int, ta, tb string) string {
		return fmt.Sprintf("(%s, %s) IN (SELECT p.a, p.b FROM unnest($%d::%s[], $%d::%s[]) AS p(a, b))", a, b, n, ta, n+1, tb)
	},
	Rows: func(alias string, cols []Column) string {
		lists := make([]string, len(cols))
		names := make([]string, len(cols))
		for i, c := range cols {
			lists[i] = fmt.Sprintf("$%d::%s[]", c.Param, c.Type)
			names[i] = c.Name
		}
		return fmt.Sprintf("unnest(%s) WITH ORDINALITY AS %s(%s, i)", strings.Join(lists, ", "), alias, strings.Join(names, ", "))
	},
	JSON: func(expr string) string { return "(" + expr + ")::jsonb" },
	List: func(v any) any { return v },
	KeyLocks: `SELECT count(pg_advisory_xact_lock(hashtextextended('outbox:' || $1::text || ':' || k, 0)))
FROM (SELECT k FROM unnest($2::text[]) AS k ORDER BY k) AS keys`,
	Notify: `SELECT pg_notify($1::text, '')`,
	UniqueViolation: func(err error) bool {
		var pgErr *pgconn.PgError
		return errors.As(err, &pgErr) && pgErr.Code == "23505"
	},
}
