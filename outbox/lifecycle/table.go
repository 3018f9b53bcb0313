package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"text/template"
	"unicode/utf8"

	"github.com/go-idempotency/idempotency/internal/pgname"
)

// Errors of the edges.
var (
	// ErrNoSelection is wrapped by the error of an operator's edge given a
	// Selector that selects nothing: no IDs, topic or ordering key, and
	// not All.
	ErrNoSelection = errors.New("lifecycle: no messages selected")
	// ErrConflict is wrapped by the error of Enqueue when another
	// transaction committed messages of the same IDs first.
	ErrConflict = errors.New("lifecycle: messages of the same IDs were committed first")
	// ErrNotClaimed is wrapped by the error of a relay's mark of one
	// message (Retry, Refuse, Unreadable, SinkSuspend) that changed
	// nothing: the message is no longer claimed under the token (its
	// claim ran out and was taken back, or an operator suspended or
	// canceled it).
	ErrNotClaimed = errors.New("lifecycle: the message is no longer claimed under this token")
)

// The codes that open the last_error the edges of this package write
// ("<code>: <message>"); the relay writes its own (relay.CodePublishFailed
// and others).
const (
	// CodeClaimExpired: the claim ran out before its relay marked an
	// outcome (reclaim).
	CodeClaimExpired = "claim_expired"
	// CodeUnreadable: the relay could not read the row (unreadable).
	CodeUnreadable = "unreadable"
	// CodeCanceled: the message was canceled (cancel).
	CodeCanceled = "canceled"
)

// MaxText bounds the text an edge keeps in last_error, suspended_reason or
// requeued_by, in bytes; longer text is cut at a character boundary.
const MaxText = 2048

// Table is the outbox table of one database: its edges and read-only
// queries, each statement rendered once from its template with the
// table's name and the dialect's fragments. A Table holds no connection;
// each method runs on the DB it is given. It is safe for concurrent use.
type Table struct {
	name    pgname.Table
	dialect Dialect
	sql     statements
}

// New returns the outbox table named name (a table, or a schema and a
// table joined by a dot, as pgstore.WithOutboxTable takes it) in the
// dialect d. It returns an error for a name pgstore would refuse.
func New(name string, d Dialect) (*Table, error) {
	t, err := pgname.ParseTable(name)
	if err != nil {
		return nil, fmt.Errorf("lifecycle: table name %w", err)
	}
	tb := &Table{name: t, dialect: d}
	if err := tb.render(); err != nil {
		return nil, err
	}
	return tb, nil
}

// Name returns the table's name as given to New.
func (t *Table) Name() string { return t.name.String() }

// Dialect returns the table's dialect.
func (t *Table) Dialect() Dialect { return t.dialect }

// Channel returns the channel on which the transactions that enqueue into
// the table wake the relays: the table's own name, without its schema.
func (t *Table) Channel() string { return t.name.Name() }

// Notify wakes the relays listening on the table's channel, once db's
// transaction commits (at once on a pool). It does nothing in a dialect
// without notifications.
func (t *Table) Notify(ctx context.Context, db DB) error {
	if t.dialect.Notify == "" {
		return nil
	}
	if err := db.Exec(ctx, t.dialect.Notify, t.Channel()); err != nil {
		return fmt.Errorf("lifecycle: notify: %w", err)
	}
	return nil
}

// vars are what a statement's template is rendered with.
type vars struct {
	// T is the quoted table name.
	T string
	// From are the states of the statement's edge.
	From                                                                  []State
	Scheduled, Ready, Claimed, RetryWait, Suspended, Done, Dead, Canceled State
	NonTerminal, Terminal, Claimable                                      []State
	// ClaimExpired opens the last_error of a reclaimed message.
	ClaimExpired string
}

// selectorSQL is the condition of the operator's edges that take a
// Selector (see Selector.args): o is the outbox row, $1 whether the IDs
// $2 (storage keys) and $3 (sequences) select, $4 the topic and $5 the
// ordering key ("" for any).
const selectorSQL = `{{define "selector"}}(NOT {{p 1 "boolean"}} OR {{inPairs "o.storage_key" "o.seq" 2 "text" "integer"}})
	AND ({{p 4 "text"}} = '' OR o.topic = {{p 4 "text"}})
	AND ({{p 5 "text"}} = '' OR o.ordering_key = {{p 5 "text"}}){{end}}`

// clockSQL is the row source of one reading of the server's clock, as
// clock.t: one reading for the whole statement, where the clock
// expression alone would be read again for each row.
const clockSQL = `{{define "clock"}}(SELECT {{now}} AS t) AS clock{{end}}`

// render renders the statements of every edge and query.
func (t *Table) render() error {
	d := t.dialect
	funcs := template.FuncMap{
		"p":           d.Param,
		"now":         func() string { return d.Now },
		"shift":       d.Shift,
		"seconds":     d.Seconds,
		"skipLocked":  d.SkipLocked,
		"lock":        d.Lock,
		"inList":      d.InList,
		"inSelect":    d.InSelect,
		"endInSelect": func() string { return d.EndInSelect },
		"inPairs":     d.InPairs,
		"json":        d.JSON,
		"rows": func(alias string, spec ...any) (string, error) {
			if len(spec)%3 != 0 {
				return "", errors.New("rows: want name, parameter and type for each column")
			}
			var cols []Column
			for i := 0; i < len(spec); i += 3 {
				name, _ := spec[i].(string)
				n, _ := spec[i+1].(int)
				typ, _ := spec[i+2].(string)
				cols = append(cols, Column{Name: name, Param: n, Type: typ})
			}
			return d.Rows(alias, cols), nil
		},
		"lit": func(v any) string { return literal(fmt.Sprint(v)) },
		"in": func(states []State) string {
			parts := make([]string, len(states))
			for i, s := range states {
				parts[i] = literal(string(s))
			}
			return "(" + strings.Join(parts, ", ") + ")"
		},
	}
	base := template.Must(template.New("base").Funcs(funcs).Parse(selectorSQL + clockSQL))
	var err error
	put := func(dst *string, e Edge, text string) {
		if err != nil {
			return
		}
		tmpl, perr := template.Must(base.Clone()).New(e.name).Parse(text)
		if perr != nil {
			err = fmt.Errorf("lifecycle: %s: %w", e.name, perr)
			return
		}
		var b strings.Builder
		v := vars{
			T: t.name.Quoted(), From: e.from,
			Scheduled: Scheduled, Ready: Ready, Claimed: Claimed, RetryWait: RetryWait,
			Suspended: Suspended, Done: Done, Dead: Dead, Canceled: Canceled,
			NonTerminal: nonTerminal, Terminal: terminal, Claimable: claimable,
			ClaimExpired: CodeClaimExpired,
		}
		if xerr := tmpl.Execute(&b, v); xerr != nil {
			err = fmt.Errorf("lifecycle: %s: %w", e.name, xerr)
			return
		}
		*dst = b.String()
	}
	for _, s := range t.sql.all() {
		put(s.dst, s.edge, s.text)
	}
	return err
}

// query is a read-only statement's place among the edges, for render: it
// has no states of its own.
func query(name string) Edge { return Edge{name: name} }

// statements are a Table's rendered statements.
type statements struct {
	enqueue, claim, extend, release, done, retry, refuse, unreadable, sinkSuspend, reclaim string
	suspend, resume, schedule, cancel, requeue, purge                                      string
	relayState, clock, counts, oldest, errors, relays, suspended, lookup, states, list     string
}

// statement is a statement to render: into dst, for edge, from text.
type statement struct {
	dst  *string
	edge Edge
	text string
}

func (s *statements) all() []statement {
	return []statement{
		{&s.enqueue, EdgeEnqueue, enqueueSQL},
		{&s.claim, EdgeClaim, claimSQL},
		{&s.extend, EdgeExtend, extendSQL},
		{&s.release, EdgeRelease, releaseSQL},
		{&s.done, EdgeDone, doneSQL},
		{&s.retry, EdgeRetry, retrySQL},
		{&s.refuse, EdgeRefuse, refuseSQL},
		{&s.unreadable, EdgeUnreadable, unreadableSQL},
		{&s.sinkSuspend, EdgeSinkSuspend, sinkSuspendSQL},
		{&s.reclaim, EdgeReclaim, reclaimSQL},
		{&s.suspend, EdgeSuspend, suspendSQL},
		{&s.resume, EdgeResume, resumeSQL},
		{&s.schedule, EdgeSchedule, scheduleSQL},
		{&s.cancel, EdgeCancel, cancelSQL},
		{&s.requeue, EdgeRequeue, requeueSQL},
		{&s.purge, EdgePurge, purgeSQL},
		{&s.relayState, query("relay state"), relayStateSQL},
		{&s.clock, query("clock"), clockNowSQL},
		{&s.counts, query("counts"), countsSQL},
		{&s.oldest, query("oldest due"), oldestSQL},
		{&s.errors, query("errors"), errorsSQL},
		{&s.relays, query("relays"), relaysSQL},
		{&s.suspended, query("suspended"), suspendedSQL},
		{&s.lookup, query("lookup"), lookupSQL},
		{&s.states, query("states"), statesSQL},
		{&s.list, query("list"), listSQL},
	}
}

// literal quotes s as an SQL string literal.
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// Text returns s as the edges keep text (last_error, suspended_reason,
// requeued_by): valid UTF-8 (invalid bytes replaced), without NUL bytes
// (which a text column refuses), at most MaxText bytes.
func Text(s string) string {
	s = strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "\uFFFD")
	if len(s) > MaxText {
		s = s[:MaxText]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
	}
	return s
}

// ErrorText returns "<code>: <err>" as Text keeps it.
func ErrorText(code string, err error) string { return Text(code + ": " + err.Error()) }

// Selector selects the messages an operator's edge acts on, among those
// in the edge's states: those of IDs, of Topic, of OrderingKey (each that
// is set must match), or All of them.
type Selector struct {
	// IDs are message IDs, "<storage key>/<sequence>" (see MessageID).
	IDs         []string
	Topic       string
	OrderingKey string
	// All selects every message in the edge's states, when nothing else
	// is set.
	All bool
}

// args returns s as the parameters $1 to $5 of the selector's condition,
// or an error wrapping ErrNoSelection or ErrInvalidID.
func (s Selector) args(d Dialect) ([]any, error) {
	if len(s.IDs) == 0 && s.Topic == "" && s.OrderingKey == "" && !s.All {
		return nil, fmt.Errorf("%w: give IDs, a topic, an ordering key, or All", ErrNoSelection)
	}
	keys := make([]string, 0, len(s.IDs))
	seqs := make([]int32, 0, len(s.IDs))
	for _, id := range s.IDs {
		key, seq, err := ParseMessageID(id)
		if err != nil {
			return nil, err
		}
		keys, seqs = append(keys, key), append(seqs, int32(seq))
	}
	return []any{len(s.IDs) > 0, d.List(keys), d.List(seqs), Text(s.Topic), Text(s.OrderingKey)}, nil
}

// Changed is a message an edge moved.
type Changed struct {
	// RowID is the message's row (the id column).
	RowID int64
	// ID is the message's ID.
	ID string
	// State is the state the edge left it in ("" for purge).
	State State
}

// collectChanged reads the rows of an edge that returns id, storage_key,
// seq and status.
func collectChanged(rows Rows, withState bool) ([]Changed, error) {
	return Collect(rows, func(row Rows) (Changed, error) {
		var c Changed
		var key string
		var seq int32
		var err error
		if withState {
			err = row.Scan(&c.RowID, &key, &seq, &c.State)
		} else {
			err = row.Scan(&c.RowID, &key, &seq)
		}
		c.ID = MessageID(key, int(seq))
		return c, err
	})
}
