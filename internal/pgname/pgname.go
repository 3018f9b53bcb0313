// Package pgname derives the names of the objects pgstore creates beside
// its table, for pgstore itself and for tools that inspect its schema.
package pgname

import "github.com/jackc/pgx/v5"

// MaxLen is PostgreSQL's longest identifier, in bytes (NAMEDATALEN-1).
const MaxLen = 63

// Truncate cuts name to MaxLen bytes, as PostgreSQL itself would (the
// names are ASCII).
func Truncate(name string) string {
	if len(name) > MaxLen {
		return name[:MaxLen]
	}
	return name
}

// AcquireFunction returns the quoted name of the acquire function of the
// table named by parts ([name] or [schema, name]): the table's name with
// "_acquire" appended, cut to MaxLen, in the table's schema.
func AcquireFunction(parts []string) string {
	last := parts[len(parts)-1]
	return pgx.Identifier(append(parts[:len(parts)-1:len(parts)-1], Truncate(last+"_acquire"))).Sanitize()
}

// ExpiresAtIndex returns the quoted name of the table's expires_at index:
// named without the schema, since an index lives in its table's.
func ExpiresAtIndex(parts []string) string {
	return pgx.Identifier{Truncate(parts[len(parts)-1] + "_expires_at_idx")}.Sanitize()
}
