package state

import (
	"context"
	"fmt"

	"github.com/go-idempotency/idempotency/outbox/lifecycle"
)

// SQLite is the dialect of SQLite, through database/sql: parameters ?n,
// times as INTEGER unix microseconds from the clock of the process that
// runs the statement, JSON as text, and no notifications (package
// sqlitestore wakes its relays in process when a transaction commits).
// SQLite has no data-modifying WITH queries: a transition is its three
// statements (Steps) in one transaction, which SQLite runs alone. Package
// sqlitestore's Store.States uses it.
var SQLite = Dialect{
	Name:  "sqlite",
	Param: func(n int, typ string) string { return fmt.Sprintf("?%d", n) },
	// SQLite takes PostgreSQL's type names, by their affinity.
	Cast:   func(expr, typ string) string { return fmt.Sprintf("CAST(%s AS %s)", expr, typ) },
	Now:    lifecycle.SQLite.Now,
	Outbox: lifecycle.SQLite,
	Steps:  true,
}

// The transition's statements where the dialect runs them one by one
// (Dialect.Steps), in one transaction: the compare-and-swap, then, when it
// moved the record, the history's row and the outbox's message.

// moveSQL is the compare-and-swap: $1 to $7 as transitionSQL's.
const moveSQL = `
UPDATE {{.T}} AS s
SET state = {{p 5 "text"}}, version = s.version + 1,
	data = coalesce({{p 7 "json"}}, s.data), updated_at = {{now}}
WHERE {{template "key"}} AND s.state = {{p 4 "text"}} AND s.version = {{p 6 "bigint"}}
RETURNING ` + recordColumns

// historyRowSQL writes the history's row: $1 the event key, $2 the new
// version, $3 From, $4 To, $5 the cause (JSON), $6 the transition's time.
const historyRowSQL = `
INSERT INTO {{.H}} (key, version, from_state, to_state, cause, at)
VALUES ({{p 1 "text"}}, {{p 2 "bigint"}}, {{p 3 "text"}}, {{p 4 "text"}}, {{p 5 "json"}}, {{p 6 "timestamptz"}})`

// eventRowSQL is the row source of the message of messageStatement: $1
// the storage key, $2 the sequence, $3 topic, $4 payload, $5 headers, $6
// ordering key, $7 the transition's time.
const eventRowSQL = `(SELECT {{p 1 "text"}} AS storage_key, {{p 2 "integer"}} AS seq, {{p 3 "text"}} AS topic,
	{{p 4 "bytea"}} AS payload, {{p 5 "text"}} AS headers, {{p 6 "text"}} AS ordering_key,
	{{p 7 "timestamptz"}} AS enqueued_at)`

// steps are the transition's statements on one outbox table, for a
// dialect with Steps.
type steps struct {
	move, history, message string
}

// newSteps renders the steps of the transition for the outbox table out.
func newSteps(d Dialect, v vars, out *lifecycle.Table) (steps, error) {
	var st steps
	var err error
	if st.move, err = render("move", moveSQL, d, v); err != nil {
		return st, err
	}
	if st.history, err = render("history row", historyRowSQL, d, v); err != nil {
		return st, err
	}
	src, err := render("event row", eventRowSQL, d, v)
	if err != nil {
		return st, err
	}
	st.message = out.InsertSequenced(src)
	return st, nil
}

// transitionSteps runs the transition as its steps in one transaction of
// db: the record as moved and 1 (the event written), or ErrNoRows when
// nothing moved.
func (s *Store) transitionSteps(ctx context.Context, db DB, m *move, args []any, rec *Record, written *int64) error {
	return lifecycle.InTx(ctx, db, func(tx DB) error {
		var data []byte
		err := lifecycle.QueryRow(ctx, tx, m.steps.move, args[:7], &rec.State, &rec.Version, &data, &rec.CreatedAt, &rec.UpdatedAt)
		if err != nil {
			return err
		}
		rec.Data = data
		key, cause, topic, payload, headers, orderingKey := args[7], args[8], args[9], args[10], args[11], args[12]
		if err := tx.Exec(ctx, m.steps.history, key, rec.Version, args[3], rec.State, cause, rec.UpdatedAt); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, m.steps.message, key, rec.Version, topic, payload, headers, orderingKey, rec.UpdatedAt)
		if err != nil {
			return err
		}
		ids, err := lifecycle.Collect(rows, func(r lifecycle.Rows) (id int64, err error) { return id, r.Scan(&id) })
		if err != nil {
			return err
		}
		*written = int64(len(ids))
		return nil
	})
}
