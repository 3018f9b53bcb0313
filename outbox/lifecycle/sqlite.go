package lifecycle

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// SQLite is the dialect of SQLite (3.42 or later), through database/sql
// (see SQL): parameters ?n, times as INTEGER unix microseconds from the
// clock of the process that runs the statement, lists bound as JSON
// arrays and read with json_each (bytes as hexadecimal text), no row
// locks and no notifications: SQLite runs one write transaction at a
// time, so a claim or an operator's edge never meets another's rows half
// changed, and the transactions that enqueue on one ordering key commit
// in the order they took the write lock, which is the order of their
// numbers. Package sqlitestore creates its table (sqlitestore.Open) and
// wakes its relays in process.
var SQLite = Dialect{
	Name:  "sqlite",
	Param: func(n int, typ string) string { return fmt.Sprintf("?%d", n) },
	// 'now' is read once per statement, in milliseconds.
	Now: "CAST(unixepoch('subsec') * 1000000 AS INTEGER)",
	Shift: func(t string, n, sign int) string {
		return fmt.Sprintf("(%s %s ?%d)", t, shiftOp(sign), n)
	},
	Seconds: func(from, to string) string {
		return fmt.Sprintf("(((%s) - (%s)) / 1000000.0)", to, from)
	},
	SkipLocked: func(string) string { return "" },
	Lock:       func(string) string { return "" },
	InList: func(expr string, n int, typ string) string {
		return fmt.Sprintf("%s IN (SELECT value FROM json_each(?%d))", expr, n)
	},
	InSelect:    func(expr string) string { return expr + " IN (" },
	EndInSelect: ")",
	InPairs: func(a, b string, n int, ta, tb string) string {
		return fmt.Sprintf("(%s, %s) IN (SELECT p.value, q.value FROM json_each(?%d) AS p JOIN json_each(?%d) AS q ON q.key = p.key)", a, b, n, n+1)
	},
	Rows: func(alias string, cols []Column) string {
		sel := make([]string, 0, len(cols)+1)
		from := make([]string, len(cols))
		for i, c := range cols {
			v := fmt.Sprintf("c%d.value", i)
			if c.Type == "bytea" {
				v = "unhex(" + v + ")"
			}
			sel = append(sel, v+" AS "+c.Name)
			from[i] = fmt.Sprintf("json_each(?%d) AS c%d", c.Param, i)
			if i > 0 {
				from[i] = "JOIN " + from[i] + fmt.Sprintf(" ON c%d.key = c0.key", i)
			}
		}
		sel = append(sel, "c0.key + 1 AS i")
		return fmt.Sprintf("(SELECT %s FROM %s) AS %s", strings.Join(sel, ", "), strings.Join(from, " "), alias)
	},
	JSON:            func(expr string) string { return "json(" + expr + ")" },
	List:            sqliteList,
	Arg:             sqliteArg,
	Time:            sqliteTime,
	UniqueViolation: sqliteUnique,
}

// sqliteList binds a Go slice as a JSON array: bytes as hexadecimal text,
// times as unix microseconds (null for a nil *time.Time).
func sqliteList(v any) any {
	var elems any = v
	switch v := v.(type) {
	case [][]byte:
		h := make([]string, len(v))
		for i, b := range v {
			h[i] = hex.EncodeToString(b)
		}
		elems = h
	case []*time.Time:
		m := make([]*int64, len(v))
		for i, t := range v {
			if t != nil {
				us := t.UnixMicro()
				m[i] = &us
			}
		}
		elems = m
	}
	b, err := json.Marshal(elems)
	if err != nil { // the edges bind slices of strings, numbers, bytes and times
		panic(fmt.Sprintf("lifecycle: a list of %T: %v", v, err))
	}
	return string(b)
}

// sqliteArg binds times and durations as microseconds.
func sqliteArg(v any) any {
	switch v := v.(type) {
	case time.Time:
		return v.UnixMicro()
	case *time.Time:
		if v == nil {
			return nil
		}
		return v.UnixMicro()
	case time.Duration:
		return v.Microseconds()
	}
	return v
}

// sqliteTime reads unix microseconds.
func sqliteTime(v any) (time.Time, error) {
	if us, ok := v.(int64); ok {
		return time.UnixMicro(us), nil
	}
	return time.Time{}, errNotA("time (INTEGER unix microseconds)", v)
}

// sqliteUnique reports whether err is SQLite's SQLITE_CONSTRAINT_UNIQUE or
// SQLITE_CONSTRAINT_PRIMARYKEY: its driver's errors have a Code method
// (modernc.org/sqlite's *Error does).
func sqliteUnique(err error) bool {
	var c interface{ Code() int }
	return errors.As(err, &c) && (c.Code() == 2067 || c.Code() == 1555)
}
