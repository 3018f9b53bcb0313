package sqlitestore

import (
	_ "embed"
	"fmt"
	"regexp"
	"strings"
)

// DefaultTable is the table Open uses without WithTable.
const DefaultTable = "idempotency_records"

//go:embed schema.sql
var schemaSQL string

// The quoted names schema.sql is written with, replaced by Schema.
const (
	schemaTable = `"idempotency_records"`
	schemaIndex = `"idempotency_records_expires_at_idx"`
)

// maxTableName bounds a table name, in bytes. SQLite has no such limit;
// the bound keeps names (and the index's, derived from them) readable.
const maxTableName = 64

var tableName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// table is a validated table name.
type table struct {
	name   string // as given
	quoted string // for SQL: "name"
	index  string // the quoted name of its expires_at index
}

func parseTable(name string) (table, error) {
	switch {
	case len(name) == 0 || len(name) > maxTableName || !tableName.MatchString(name):
		return table{}, fmt.Errorf("sqlitestore: table name %q is not 1 to %d ASCII letters, digits and underscores, starting with a letter or an underscore", name, maxTableName)
	case strings.HasPrefix(strings.ToLower(name), "sqlite_"):
		return table{}, fmt.Errorf("sqlitestore: table name %q starts with sqlite_, which SQLite reserves", name)
	}
	return table{name: name, quoted: `"` + name + `"`, index: `"` + name + `_expires_at_idx"`}, nil
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

// Schema returns the SQL that creates the table named name and its index
// on expires_at (named after the table with "_expires_at_idx" appended):
// the embedded schema.sql with the names put in, quoted. Both statements
// are idempotent (IF NOT EXISTS). Open runs it; teams that manage their
// own migrations can add it to theirs. It panics when name is not a table
// name (see WithTable).
func Schema(name string) string {
	t := mustTable(name)
	return strings.NewReplacer(schemaIndex, t.index, schemaTable, t.quoted).Replace(schemaSQL)
}

// column is a column of the records' table as PRAGMA table_xinfo reports
// it.
type column struct {
	name, typ string
	notNull   bool
	pk        bool
}

func (c column) String() string {
	s := c.name + " " + c.typ
	if c.pk {
		s += " PRIMARY KEY"
	} else if c.notNull {
		s += " NOT NULL"
	}
	return s
}

// columns are the columns of schema.sql's table, which the Store's
// statements read and write.
var columns = []column{
	{"key", "TEXT", true, true},
	{"state", "TEXT", true, false},
	{"token", "TEXT", true, false},
	{"fingerprint", "BLOB", true, false},
	{"epoch", "INTEGER", true, false},
	{"lease_until", "INTEGER", true, false},
	{"ttl_until", "INTEGER", true, false},
	{"expires_at", "INTEGER", true, false},
	{"status", "INTEGER", false, false},
	{"headers", "BLOB", false, false},
	{"body", "BLOB", false, false},
	{"body_omitted", "INTEGER", false, false},
	{"updated_at", "INTEGER", true, false},
}
