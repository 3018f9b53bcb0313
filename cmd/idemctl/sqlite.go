package main

import (
	"context"
	"fmt"

	"github.com/go-idempotency/idempotency/servercheck"
	"github.com/go-idempotency/idempotency/sqlitestore"
)

// sqliteFile is an SQLite file of sqlitestore, which check judges with
// sqlitestore.CheckFile. It is a checker, not a backend: the other
// commands read Redis and PostgreSQL only.
type sqliteFile struct {
	path, table string
}

func (f *sqliteFile) describe() string { return fmt.Sprintf("sqlite %s, table %s", f.path, f.table) }

func (f *sqliteFile) check(ctx context.Context, opts checkOptions) (servercheck.Report, error) {
	return sqlitestore.CheckFile(ctx, f.path, f.table, sqlitestore.WithPurgeLag(opts.purgeLag))
}

// close does nothing: CheckFile opens and closes its own connection.
func (f *sqliteFile) close() {}
