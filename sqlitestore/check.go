package sqlitestore

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/go-idempotency/idempotency"
)

// Check checks the file's settings, as Open does before it returns: that
// the connections can write (PRAGMA query_only is off, and neither the
// file, its -wal and -shm files nor the connection is read-only), that its
// directory is writable (SQLite creates the -wal and -shm files there),
// that the journal is in WAL mode, that synchronous is FULL, and that the
// records' table has sqlitestore's columns. It returns nil, or an error
// naming the first thing that is wrong. It writes nothing to the database
// (its write check is rolled back); it creates and removes an empty file
// in the directory. It waits for a transactional handler of the Store
// that runs, for as long as ctx allows. Run it again after the file was
// moved or its permissions changed. CheckFile judges a file from outside
// the application, item by item.
func (s *Store) Check(ctx context.Context) error {
	if s.closed.Load() {
		return idempotency.ErrStoreClosed
	}
	// The write check takes the write lock: wait for the Store's own
	// writers here, not in SQLite's busy handler.
	if err := s.take(ctx); err != nil {
		return fmt.Errorf("sqlitestore: check %s: %w", s.path, err)
	}
	err := s.checkSettings(ctx)
	s.give()
	if err != nil {
		return err
	}
	return s.checkSchema(ctx, false)
}

// checkSettings checks everything but the table, on one connection.
func (s *Store) checkSettings(ctx context.Context) error {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("sqlitestore: %s: "+format, append([]any{s.path}, args...)...)
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		// The connection's own pragmas write (journal_mode=WAL creates
		// the -wal file).
		if code(err) == sqlite3.SQLITE_READONLY {
			return fail("the database cannot be written: %s (%w)", readOnlyCause(s.path), err)
		}
		return fail("open: %w", err)
	}
	defer conn.Close()
	if err := checkWrite(ctx, conn, s.path); err != nil {
		return fail("%w", err)
	}
	if err := checkDir(s.path); err != nil {
		return fail("%w", err)
	}
	mode, err := pragma(ctx, conn, "journal_mode")
	if err != nil {
		return fail("%w", err)
	}
	if !isWAL(mode) {
		return fail("the journal mode is %q, not WAL: SQLite could not switch the file to WAL, which readers need to run beside the writer (WAL needs shared memory between the processes that open the file, which a network filesystem does not give; a file in memory has no WAL either)", mode)
	}

	// 2 is FULL, 3 EXTRA: in WAL mode, FULL syncs the WAL at every
	// commit, so a record acknowledged to the middleware survives a power
	// loss.
	if syncMode, err := pragma(ctx, conn, "synchronous"); err != nil {
		return fail("%w", err)
	} else if syncMode != "2" && syncMode != "3" {
		return fail("PRAGMA synchronous is %s, not FULL (2): a commit would not survive a power loss", syncMode)
	}
	return nil
}

// pragma returns the value of PRAGMA name on conn.
func pragma(ctx context.Context, conn *sql.Conn, name string) (string, error) {
	var v string
	if err := conn.QueryRowContext(ctx, "PRAGMA "+name).Scan(&v); err != nil {
		return "", fmt.Errorf("PRAGMA %s: %w", name, err)
	}
	return v, nil
}

// isWAL reports whether mode, PRAGMA journal_mode's answer, is WAL.
func isWAL(mode string) bool { return strings.EqualFold(mode, "wal") }

// checkWrite checks that conn can write to the file at path: PRAGMA
// query_only is off, and a write, rolled back, succeeds. The error says
// why not, and wraps SQLite's.
func checkWrite(ctx context.Context, conn *sql.Conn, path string) error {
	queryOnly, err := pragma(ctx, conn, "query_only")
	if err != nil {
		return err
	}
	if queryOnly != "0" {
		return fmt.Errorf("the connection is query-only (PRAGMA query_only = %s): the store writes a record for every first request", queryOnly)
	}
	// A read-only connection takes the write lock (BEGIN IMMEDIATE) but
	// fails its first write: a table created in a transaction rolled
	// back, so nothing is written, and named so as to be no one's.
	if err := writeProbe(ctx, conn); err != nil {
		if code(err) == sqlite3.SQLITE_READONLY {
			return fmt.Errorf("the database cannot be written: %s (%w)", readOnlyCause(path), err)
		}
		return fmt.Errorf("a write rolled back: %w", err)
	}
	return nil
}

// writeProbe creates a table in a transaction on conn, and rolls it back.
func writeProbe(ctx context.Context, conn *sql.Conn) error {
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var b [8]byte
	rand.Read(b[:])
	_, err = tx.ExecContext(ctx, fmt.Sprintf(`CREATE TABLE "sqlitestore_write_check_%x" (x)`, b))
	return err
}

// checkDir checks that a file can be created in the directory of the
// database at path, as SQLite creates the -wal and -shm files there: it
// creates an empty file and removes it.
func checkDir(path string) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".sqlitestore-check-*")
	if err != nil {
		return fmt.Errorf("its directory %s is not writable, and SQLite creates the database's -wal and -shm files there: %w", dir, err)
	}
	f.Close()
	os.Remove(f.Name())
	return nil
}

// readOnlyCause says why SQLite refused to write to the database at path:
// the mode of the file or of its -wal or -shm file, its directory, or
// else how the connection was opened.
func readOnlyCause(path string) string {
	for _, name := range []string{path, path + "-wal", path + "-shm"} {
		if fi, err := os.Stat(name); err == nil && fi.Mode().Perm()&0o222 == 0 {
			return fmt.Sprintf("the file %s is read-only (mode %v)", name, fi.Mode().Perm())
		}
	}
	if err := checkDir(path); err != nil {
		return err.Error()
	}
	return "the connection is read-only (the file's permissions, a read-only mount, or mode=ro in its URI)"
}

// fileURI is the URI of the file at path, without a query: a URI's path
// takes "%" as an escape, and "?" and "#" as delimiters.
func fileURI(path string) string {
	return "file:" + strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path)
}

// code returns the primary SQLite result code of err, or 0.
func code(err error) int {
	var e *sqlite.Error
	if errors.As(err, &e) {
		return e.Code() & 0xff
	}
	return 0
}

// checkSchema compares the records' table with schema.sql's. A missing
// table is an error unless missingOK (before Open creates it).
func (s *Store) checkSchema(ctx context.Context, missingOK bool) error {
	have, err := readColumns(ctx, s.db, s.cfg.table)
	if err != nil {
		return fmt.Errorf("sqlitestore: %s: %w", s.path, err)
	}
	switch {
	case len(have) == 0 && missingOK:
		return nil
	case len(have) == 0:
		return fmt.Errorf("sqlitestore: %s: there is no table %s", s.path, s.cfg.table.quoted)
	}
	if !sameColumns(have) {
		return fmt.Errorf("sqlitestore: %s: the table %s has the columns (%s), not sqlitestore's (%s): it is another table of that name; choose another name with WithTable",
			s.path, s.cfg.table.quoted, joinColumns(have), joinColumns(columns))
	}
	return nil
}

// querier is what readColumns reads through: a *sql.DB or a *sql.Conn.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// readColumns returns the columns of the table t as PRAGMA table_xinfo
// reports them: none when there is no such table.
func readColumns(ctx context.Context, q querier, t table) ([]column, error) {
	rows, err := q.QueryContext(ctx, "SELECT name, upper(type), \"notnull\", pk FROM pragma_table_xinfo(?)", t.name)
	if err != nil {
		return nil, fmt.Errorf("read the columns of %s: %w", t.quoted, err)
	}
	defer rows.Close()
	var have []column
	for rows.Next() {
		var c column
		var notNull, pk int
		if err := rows.Scan(&c.name, &c.typ, &notNull, &pk); err != nil {
			return nil, fmt.Errorf("read the columns of %s: %w", t.quoted, err)
		}
		c.notNull, c.pk = notNull != 0, pk != 0
		have = append(have, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the columns of %s: %w", t.quoted, err)
	}
	return have, nil
}

// sameColumns reports whether have are schema.sql's columns, in any
// order.
func sameColumns(have []column) bool {
	sortColumns := func(cs []column) []column {
		cs = slices.Clone(cs)
		slices.SortFunc(cs, func(a, b column) int { return strings.Compare(a.name, b.name) })
		return cs
	}
	return slices.Equal(sortColumns(have), sortColumns(columns))
}

func joinColumns(cs []column) string {
	names := make([]string, len(cs))
	for i, c := range cs {
		names[i] = c.String()
	}
	return strings.Join(names, ", ")
}
