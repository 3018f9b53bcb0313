package pgstore

import (
	"context"
	_ "embed"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency/internal/pgname"
)

// DefaultTable is the table New and Migrate use without WithTable.
const DefaultTable = "idempotency_records"

// DefaultOutboxTable is the name of the outbox table (see package outbox)
// that New and Migrate use without WithOutboxTable, in the schema of the
// records' table.
const DefaultOutboxTable = "idempotency_outbox"

// DefaultStateTable is the name of the table of state records (see package
// state) that Migrate creates, with its history table (StateHistoryTable),
// in the schema of the records' table.
const DefaultStateTable = "idempotency_state"

//go:embed schema.sql
var schemaSQL string

//go:embed outbox.sql
var outboxSQL string

//go:embed state.sql
var stateSQL string

// The quoted names state.sql is written with, replaced by StateSchema.
const (
	stateTable   = `"idempotency_state"`
	stateHistory = `"idempotency_state_history"`
)

// The quoted names outbox.sql is written with, replaced by OutboxSchema.
const (
	outboxTable = `"idempotency_outbox"`
	outboxIndex = `"idempotency_outbox_`
)

// The quoted names schema.sql is written with, replaced by Schema.
const (
	schemaTable   = `"idempotency_records"`
	schemaIndex   = `"idempotency_records_expires_at_idx"`
	schemaAcquire = `"idempotency_records_acquire"`
)

// maxIdentifier is PostgreSQL's longest identifier, in bytes (NAMEDATALEN-1).
const maxIdentifier = pgname.MaxLen

// table is a validated table name.
type table struct {
	parts   []string // [name] or [schema, name]
	quoted  string   // for SQL: "schema"."name"
	index   string   // the quoted name of its expires_at index
	acquire string   // the quoted name of its acquire function: "schema"."name_acquire"
}

// parseTable validates name as pgname.ParseTable does: one identifier, or
// two joined by a dot (schema and table), each of 1 to 63 letters, digits
// and underscores, not starting with a digit.
func parseTable(name string) (table, error) {
	t, err := pgname.ParseTable(name)
	if err != nil {
		return table{}, fmt.Errorf("pgstore: table name %w", err)
	}
	return table{parts: t.Parts, quoted: t.Quoted(), index: t.ExpiresAtIndex(), acquire: t.AcquireFunction()}, nil
}

// mustTable is parseTable for options and Schema: a bad name is a
// programming error.
func mustTable(name string) table {
	t, err := parseTable(name)
	if err != nil {
		panic(err.Error())
	}
	return t
}

// Schema returns the SQL that creates the table named name, its index and
// the function that the acquire statement calls to write (named after the
// table with "_acquire" appended, in the table's schema), the outbox table
// DefaultOutboxTable with its indexes and the state records' tables
// (DefaultStateTable and its history), both in the same schema: the
// embedded schema.sql, outbox.sql and state.sql with the names put in,
// quoted. Every statement in it is idempotent (CREATE ... IF NOT EXISTS,
// CREATE OR REPLACE FUNCTION), so it can be run on every start, or added to
// a migration tool's files by teams that manage their own migrations; run
// it again after upgrading pgstore, since a new version may change the
// function. name is a table (DefaultTable, for instance) or a
// schema-qualified table ("billing.idempotency"); the names are quoted, so
// they are case-sensitive. Schema panics when name is not such a name.
// With WithOutboxTable, take the records' part from RecordsSchema, the
// outbox's from OutboxSchema and the state records' from StateSchema.
func Schema(name string) string {
	t := mustTable(name)
	sibling := func(n string) string { return pgname.Table{Parts: t.parts}.Sibling(n).String() }
	return RecordsSchema(name) + "\n" + OutboxSchema(sibling(DefaultOutboxTable)) + "\n" + StateSchema(sibling(DefaultStateTable))
}

// RecordsSchema returns the part of Schema that creates the records' table
// named name, its index and its acquire function: the embedded schema.sql
// with the names put in, quoted. It panics when name is not a table name.
func RecordsSchema(name string) string {
	t := mustTable(name)
	return strings.NewReplacer(schemaIndex, t.index, schemaAcquire, t.acquire, schemaTable, t.quoted).Replace(schemaSQL)
}

// OutboxSchema returns the SQL that creates the outbox table named name
// (see package outbox and WithOutboxTable) and its indexes (named after
// the table, without its schema): the embedded outbox.sql with the names
// put in, quoted. Every statement in it is idempotent (CREATE ... IF NOT
// EXISTS). It panics when name is not a table name, as Schema does.
func OutboxSchema(name string) string {
	t := mustTable(name)
	pt := pgname.Table{Parts: t.parts}
	r := strings.NewReplacer(
		outboxIndex+`due_idx"`, pt.Index("due"),
		outboxIndex+`order_idx"`, pt.Index("order"),
		outboxIndex+`claim_idx"`, pt.Index("claim"),
		outboxIndex+`finished_idx"`, pt.Index("finished"),
		outboxTable, t.quoted)
	return r.Replace(outboxSQL)
}

// StateSchema returns the SQL that creates the table of state records
// named name (see package state and its WithTable) and its history table,
// named StateHistoryTable(name): the embedded state.sql with the names put
// in, quoted. Every statement in it is idempotent (CREATE ... IF NOT
// EXISTS). It panics when name is not a table name, or when the history's
// name would be longer than PostgreSQL's identifiers (63 bytes).
func StateSchema(name string) string {
	t := mustTable(name)
	h := mustTable(StateHistoryTable(name))
	return strings.NewReplacer(stateHistory, h.quoted, stateTable, t.quoted).Replace(stateSQL)
}

// StateHistoryTable returns the name of the history table of the state
// records' table named name: name with "_history" appended, in the same
// schema.
func StateHistoryTable(name string) string { return name + "_history" }

// Migrate creates the store's table and its index when they do not exist,
// creates or replaces the function that the acquire statement calls, and
// creates the outbox table and its indexes, and the state records' tables
// (DefaultStateTable and its history, in the schema of the store's table),
// when they do not exist, in one transaction under an advisory lock, so
// that instances starting together do not race each other. It takes the
// options of New, of which only WithTable and WithOutboxTable matter, and
// panics on a bad option as New does. The schema it runs is
// RecordsSchema's, OutboxSchema's and StateSchema's (Schema's without
// WithOutboxTable); a table that already exists is left as it is.
//
// Migrate runs a part of the schema (the records', the outbox's, the state
// records') only when one of its tables or indexes is missing; otherwise it
// only replaces the acquire function. A CREATE INDEX takes a lock on its
// table that waits for every transaction writing to it, and that new
// writers wait behind, even when the index exists (IF NOT EXISTS is
// checked under the lock); taken on a schema already in place, beside
// instances that are serving, it would stall their writes, and deadlock
// with a transaction that wrote the outbox and then writes the records'
// table. On a schema already in place, Migrate takes no lock on any table.
func Migrate(ctx context.Context, pool *pgxpool.Pool, opts ...Option) error {
	if pool == nil {
		panic("pgstore: Migrate: nil pool")
	}
	cfg := newConfig(opts)
	records := pgname.Table{Parts: cfg.table.parts}
	outbox := pgname.Table{Parts: cfg.outbox.parts}
	states := records.Sibling(DefaultStateTable)
	history := records.Sibling(StateHistoryTable(DefaultStateTable))
	// index names the index on what of table t: a relation in t's schema.
	index := func(t pgname.Table, what string) pgname.Table { return t.Sibling(t.IndexName(what)) }
	parts := []struct {
		name      pgname.Table
		sql       string
		relations []pgname.Table // its tables and indexes
		always    string         // run even when none is missing
	}{{
		name:      records,
		sql:       RecordsSchema(records.String()),
		relations: []pgname.Table{records, index(records, "expires_at")},
		always:    acquireFunction(records.String()),
	}, {
		name: outbox,
		sql:  OutboxSchema(outbox.String()),
		relations: []pgname.Table{outbox,
			index(outbox, "due"), index(outbox, "order"), index(outbox, "claim"), index(outbox, "finished")},
	}, {
		name:      states,
		sql:       StateSchema(states.String()),
		relations: []pgname.Table{states, history},
	}}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", "pgstore:migrate:"+cfg.table.quoted); err != nil {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	for _, p := range parts {
		names := make([]string, len(p.relations))
		for i, r := range p.relations {
			names[i] = r.Quoted()
		}
		var missing bool
		if err := tx.QueryRow(ctx, missingSQL, names).Scan(&missing); err != nil {
			return fmt.Errorf("pgstore: migrate %s: %w", p.name.Quoted(), err)
		}
		sql := p.sql
		if !missing {
			sql = p.always
		}
		if sql == "" {
			continue
		}
		// Without arguments Exec uses the simple protocol, which takes
		// several statements at once.
		if _, err := tx.Exec(ctx, sql); err != nil {
			return fmt.Errorf("pgstore: migrate %s: %w", p.name.Quoted(), err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	return nil
}

// missingSQL tells whether any of the relations named $1 (quoted,
// schema-qualified or found on the search path, as the schema's statements
// find them) is missing. to_regclass takes no lock.
const missingSQL = `SELECT bool_or(to_regclass(n) IS NULL) FROM unnest($1::text[]) AS n`

// acquireFunction returns the statement of RecordsSchema(name) that creates
// or replaces the acquire function: the last of schema.sql, from its
// CREATE OR REPLACE FUNCTION to the end. It takes no lock on a table.
func acquireFunction(name string) string {
	sql := RecordsSchema(name)
	return sql[strings.LastIndex(sql, "CREATE OR REPLACE FUNCTION"):]
}
