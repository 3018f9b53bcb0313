// Package pgname parses the name of pgstore's table and derives the names
// of the objects pgstore creates beside it, for pgstore itself and for the
// tools that inspect its schema.
package pgname

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// MaxLen is PostgreSQL's longest identifier, in bytes (NAMEDATALEN-1).
const MaxLen = 63

// identifier is one part of a table name: a letter or underscore, then
// letters, digits and underscores, 1 to MaxLen in all.
var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// Table is a validated table name: one identifier, or a schema and a table
// joined by a dot.
type Table struct {
	// Parts is [name] or [schema, name].
	Parts []string
}

// ParseTable validates name: one identifier, or two joined by a dot, each of
// 1 to MaxLen letters, digits and underscores, not starting with a digit.
// Its errors name the table first, so that callers can prefix them ("table
// name", "-table").
func ParseTable(name string) (Table, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return Table{}, fmt.Errorf("%q has more than two parts", name)
	}
	for _, p := range parts {
		if !identifier.MatchString(p) {
			return Table{}, fmt.Errorf("%q: %q is not an identifier of 1 to %d letters, digits and underscores", name, p, MaxLen)
		}
	}
	return Table{Parts: parts}, nil
}

// String returns the name as given to ParseTable.
func (t Table) String() string { return strings.Join(t.Parts, ".") }

// Quoted returns the name quoted for SQL: "schema"."name".
func (t Table) Quoted() string { return pgx.Identifier(t.Parts).Sanitize() }

// AcquireFunction returns the quoted name of the table's acquire function:
// the table's name with "_acquire" appended, cut to MaxLen, in the table's
// schema.
func (t Table) AcquireFunction() string {
	schema := slices.Clip(t.Parts[:len(t.Parts)-1])
	return pgx.Identifier(append(schema, truncate(t.Name()+"_acquire"))).Sanitize()
}

// ExpiresAtIndex returns the quoted name of the table's expires_at index:
// named without the schema, since an index lives in its table's.
func (t Table) ExpiresAtIndex() string { return t.Index("expires_at") }

// Index returns the quoted name of the table's index on what: the table's
// name, an underscore, what and "_idx", cut to MaxLen, without the schema
// (an index lives in its table's).
func (t Table) Index(what string) string {
	return pgx.Identifier{t.IndexName(what)}.Sanitize()
}

// IndexName returns the name of the table's index on what, unquoted, as
// PostgreSQL's catalog holds it (pg_class.relname): Index without the
// quotes.
func (t Table) IndexName(what string) string { return truncate(t.Name() + "_" + what + "_idx") }

// Sibling returns the table named name in t's schema.
func (t Table) Sibling(name string) Table {
	return Table{Parts: append(slices.Clip(t.Parts[:len(t.Parts)-1]), name)}
}

// Name returns the table's own name, without its schema.
func (t Table) Name() string { return t.Parts[len(t.Parts)-1] }

// truncate cuts name to MaxLen bytes, as PostgreSQL itself would (the
// names are ASCII).
func truncate(name string) string { return name[:min(len(name), MaxLen)] }
