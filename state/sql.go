package state

import (
	"fmt"
	"strings"
	"text/template"

	"github.com/go-idempotency/idempotency/outbox/lifecycle"
)

// The statements of a Store: one per operation, each a template rendered
// once with the tables' names and the dialect's fragments. Every write is
// a single statement, so that outside a caller's transaction it is a
// transaction of its own, and one round trip; a write refused (a
// conflict, a record that exists) reads the record after it, to say why.

// The parameters naming a record, shared by the statements: $1 scope, $2
// machine, $3 id. keySQL is their condition on the alias s.
const keySQL = `{{define "key"}}s.scope = {{p 1 "text"}} AND s.machine = {{p 2 "text"}} AND s.id = {{p 3 "text"}}{{end}}`

// The columns of a record that a statement returns.
const recordColumns = `state, version, data, created_at, updated_at`

// createSQL is Create: it inserts the record at version 1 unless one
// exists, and returns it; no row when one exists (Create then reads it).
//
//	$1 $2 $3 the record; $4 state; $5 data (JSON)
const createSQL = `
INSERT INTO {{.T}} (scope, machine, id, state, version, data, created_at, updated_at)
SELECT {{p 1 "text"}}, {{p 2 "text"}}, {{p 3 "text"}}, {{p 4 "text"}}, 1, {{p 5 "json"}}, clock.t, clock.t
FROM (SELECT {{now}} AS t) AS clock
WHERE true
ON CONFLICT (scope, machine, id) DO NOTHING
RETURNING ` + recordColumns

// getSQL is Get.
const getSQL = `SELECT ` + recordColumns + ` FROM {{.T}} AS s WHERE {{template "key"}}`

// transitionSQL is Transition: the compare-and-swap, the history's row
// and the outbox's message, and the relays' wake-up, in one statement.
//
//	$1 $2 $3 the record; $4 From; $5 To; $6 ExpectedVersion; $7 the new
//	data (JSON; NULL keeps the stored data); $8 the event key (the
//	history's key, the message's storage key); $9 the cause (JSON); $10
//	the message's topic, $11 payload, $12 headers (a JSON object) and $13
//	ordering key
//
// moved is the record updated where it is in From at ExpectedVersion:
// under READ COMMITTED, a transition racing on the same version waits
// for the row's lock, then finds the row's new version, which no longer
// matches, and updates nothing. Only when moved has its row are the
// history's row and the message written (their sequence, the new
// version, is the message's place among the record's messages; their
// time, the transition's), and the relays woken. The statement returns
// the moved record and the number of messages written (1), or no row
// when nothing moved: the caller then reads the record to say why.
const transitionSQL = `
WITH moved AS (
	UPDATE {{.T}} AS s
	SET state = {{p 5 "text"}}, version = s.version + 1,
		data = coalesce({{p 7 "json"}}, s.data), updated_at = {{now}}
	WHERE {{template "key"}} AND s.state = {{p 4 "text"}} AND s.version = {{p 6 "bigint"}}
	RETURNING s.state, s.version, s.data, s.created_at, s.updated_at
),
history AS (
	INSERT INTO {{.H}} (key, version, from_state, to_state, cause, at)
	SELECT {{p 8 "text"}}, m.version, {{p 4 "text"}}, m.state, {{p 9 "json"}}, m.updated_at
	FROM moved AS m
),
message AS (
	SELECT {{p 8 "text"}} AS storage_key, {{cast "m.version" "integer"}} AS seq, {{p 10 "text"}} AS topic,
		{{p 11 "bytea"}} AS payload, {{p 12 "text"}} AS headers, {{p 13 "text"}} AS ordering_key,
		m.updated_at AS enqueued_at
	FROM moved AS m
),
event AS (
	{{.Enqueue}}
)
SELECT m.state, m.version, m.data, m.created_at, m.updated_at,
	(SELECT count({{if .Notify}}{{.Notify}}{{else}}*{{end}}) FROM event)
FROM moved AS m`

// historySQL is History: the transitions of the event key $1 after the
// version $2, in version order, at most $3.
const historySQL = `
SELECT version, from_state, to_state, cause, at
FROM {{.H}}
WHERE key = {{p 1 "text"}} AND version > {{p 2 "bigint"}}
ORDER BY version
LIMIT {{p 3 "bigint"}}`

// statements are a Store's statements, but the transition's, which
// depends on the outbox table (see transitionStatement).
type statements struct {
	create, get, history string
}

// vars are what a statement's template is rendered with.
type vars struct {
	// T and H are the quoted names of the records' table and of its
	// history.
	T, H string
	// Enqueue is the outbox's enqueue of the row source "message"
	// (lifecycle.Table.InsertSequenced), and Notify the expression that
	// wakes its relays ("" when the dialect has none): the transition's.
	Enqueue, Notify string
}

// render renders the statement text with v in dialect d.
func render(name, text string, d Dialect, v vars) (string, error) {
	funcs := template.FuncMap{
		"p":    d.Param,
		"cast": d.Cast,
		"now":  func() string { return d.Now },
	}
	tmpl, err := template.New(name).Funcs(funcs).Parse(keySQL + text)
	if err != nil {
		return "", fmt.Errorf("state: %s: %w", name, err)
	}
	var b strings.Builder
	if err := tmpl.Execute(&b, v); err != nil {
		return "", fmt.Errorf("state: %s: %w", name, err)
	}
	return b.String(), nil
}

// newStatements renders the statements that do not depend on the outbox.
func newStatements(d Dialect, v vars) (statements, error) {
	var s statements
	for _, st := range []struct {
		dst        *string
		name, text string
	}{
		{&s.create, "create", createSQL},
		{&s.get, "get", getSQL},
		{&s.history, "history", historySQL},
	} {
		sql, err := render(st.name, st.text, d, v)
		if err != nil {
			return statements{}, err
		}
		*st.dst = sql
	}
	return s, nil
}

// transitionStatement renders the transition's statement for the outbox
// table out.
func transitionStatement(d Dialect, v vars, out *lifecycle.Table) (string, error) {
	v.Enqueue = out.InsertSequenced("message")
	if d.Notify != nil {
		v.Notify = d.Notify(out.Channel())
	}
	return render("transition", transitionSQL, d, v)
}
