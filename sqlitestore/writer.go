package sqlitestore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"maps"
	"slices"
	"strings"

	sqlite3 "modernc.org/sqlite/lib"

	"github.com/go-idempotency/idempotency"
)

// stmtIn gives a write transaction the Store's statement st (one of
// Store.stmt, prepared on the *sql.DB) as it runs in that transaction: a
// *sql.Tx's StmtContext for a handler's transaction (Tx), the writer's
// own for the Store's writes.
type stmtIn func(ctx context.Context, st *sql.Stmt) *sql.Stmt

// writer is the connection the Store's own write transactions run on, in
// the Store's write turn, with BEGIN IMMEDIATE, COMMIT, ROLLBACK and the
// Store's statements prepared on it once. database/sql's Tx would have the
// driver prepare BEGIN and COMMIT again for every transaction and watch
// its context with a goroutine of its own: a first execution's two write
// transactions took about 80 µs more than two autocommit statements on
// the same file, and the prepared BEGIN IMMEDIATE and COMMIT take what
// those take (measured in process, 1 KiB bodies, each commit synced to
// disk: about 480 µs for the pair either way). The Store keeps it from
// Open to Close, on top of WithMaxConns's connections, and replaces it
// after a transaction it could not end cleanly.
//
// A transactional request's transaction (Store.BeginTx) runs on it too:
// the request holds the write turn anyway, and SQLite empties a
// connection's page cache whenever another connection has committed since
// its last transaction. With the request's transaction on a connection
// of the pool, the Store's write and the request's took turns emptying
// each other's cache, and each read its pages again from the file: 15
// reads of a page per request against 3.4 on the writer (strace -c, 500
// requests), and in process the store's time over its transactional
// floor fell from 1.19–1.21× to 1.03–1.16× (benchmarks/sqlitebench,
// BenchmarkFloor/work=tx).
type writer struct {
	conn                    *sql.Conn
	begin, commit, rollback *sql.Stmt
	stmts                   map[*sql.Stmt]*sql.Stmt // the Store's statement → the same on conn
	// broken is set when a transaction on conn could not be ended: the
	// writer is closed instead of kept.
	broken bool
}

// openWriter takes a connection of db for the writer and prepares the
// transaction's statements and those of st on it.
func openWriter(ctx context.Context, db *sql.DB, st statements) (*writer, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	w := &writer{conn: conn, stmts: map[*sql.Stmt]*sql.Stmt{}}
	prepare := func(query string) (*sql.Stmt, error) {
		s, err := conn.PrepareContext(ctx, query)
		if err != nil {
			return nil, fmt.Errorf("prepare %q on the writer: %w", query, err)
		}
		return s, nil
	}
	for _, p := range []struct {
		stmt  **sql.Stmt
		query string
	}{{&w.begin, "BEGIN IMMEDIATE"}, {&w.commit, "COMMIT"}, {&w.rollback, "ROLLBACK"}} {
		if *p.stmt, err = prepare(p.query); err != nil {
			w.close(false)
			return nil, err
		}
	}
	for _, s := range st.writes {
		if w.stmts[s.stmt], err = prepare(s.query); err != nil {
			w.close(false)
			return nil, err
		}
	}
	return w, nil
}

// stmt is the writer's stmtIn.
func (w *writer) stmt(_ context.Context, st *sql.Stmt) *sql.Stmt { return w.stmts[st] }

// close closes the writer's statements and gives its connection back to
// the pool, or, when bad, has database/sql close it: a connection whose
// transaction could not be ended is never used again.
func (w *writer) close(bad bool) {
	for _, s := range append([]*sql.Stmt{w.begin, w.commit, w.rollback}, slices.Collect(maps.Values(w.stmts))...) {
		if s != nil {
			s.Close()
		}
	}
	if bad {
		_ = w.conn.Raw(func(any) error { return driver.ErrBadConn })
	}
	w.conn.Close()
}

// write runs fn in a write transaction of the Store's writer: BEGIN
// IMMEDIATE, in the Store's write turn, so that what fn reads stays true
// until the COMMIT. fn gets the Store's clock read under the lock and the
// writer's statements, and returns whether to commit.
//
// ctx bounds the waits: for the turn, and for the write lock (the BEGIN);
// a ctx that ended before the COMMIT rolls the transaction back. fn's
// statements, the COMMIT and the ROLLBACK get ctx without its
// cancellation: under the write lock a statement waits for nothing, and
// the driver watches a context that can end with a goroutine of its own
// for every statement (3% of a first execution's time, measured against
// the record floor in benchmarks/sqlitebench).
func (s *Store) write(ctx context.Context, fn func(ctx context.Context, in stmtIn, now int64) (commit bool, err error)) error {
	return s.withWriter(ctx, func(w *writer) error {
		if _, err := w.begin.ExecContext(ctx); err != nil {
			// A BEGIN IMMEDIATE that failed (busy, interrupted) began no
			// transaction.
			return fmt.Errorf("begin: %w", err)
		}
		in := context.WithoutCancel(ctx)
		commit, err := fn(in, w.stmt, s.now())
		if err == nil && commit && ctx.Err() != nil {
			err = fmt.Errorf("before commit: %w", context.Cause(ctx))
		}
		if err == nil && commit {
			if _, err = w.commit.ExecContext(in); err == nil {
				return nil
			}
			err = fmt.Errorf("commit: %w", err)
		}
		w.abort(in)
		return err
	})
}

// abort rolls back the transaction of w's connection, if one is open.
// After SQLITE_FULL, SQLITE_IOERR, SQLITE_BUSY or SQLITE_NOMEM SQLite may
// have rolled it back itself, and the ROLLBACK then fails with no harm
// done (SQLite's documentation of these errors asks for it all the same).
// A ROLLBACK that fails otherwise may leave the connection in a
// transaction: w is broken, and not used again.
func (w *writer) abort(ctx context.Context) {
	if _, err := w.rollback.ExecContext(ctx); err != nil && !noTransaction(err) {
		w.broken = true
	}
}

// autocommit runs st, one of the Store's statements, on the writer as a
// transaction of its own (SQLite commits it, or rolls it back when it
// fails), in the Store's write turn, with the arguments args gives for
// the Store's clock read in the turn. It returns the rows st changed. ctx
// bounds the waits, for the turn and for the file's write lock.
func (s *Store) autocommit(ctx context.Context, st *sql.Stmt, args func(now int64) []any) (n int64, err error) {
	err = s.withWriter(ctx, func(w *writer) error {
		res, err := w.stmt(ctx, st).ExecContext(ctx, args(s.now())...)
		if err == nil {
			n, err = res.RowsAffected()
		}
		return err
	})
	return n, err
}

// withWriter runs fn with the Store's writer, in the Store's write turn.
func (s *Store) withWriter(ctx context.Context, fn func(*writer) error) error {
	if err := s.take(ctx); err != nil {
		return err
	}
	defer s.give()
	w, err := s.takeWriter(ctx)
	if err != nil {
		return err
	}
	defer s.putWriter(w)
	return fn(w)
}

// takeWriter takes the Store's writer, opening one when the last one was
// closed, until putWriter gives it back. The caller holds the write turn,
// so that the writer is nobody else's meanwhile; Close, which takes no
// turn, closes the writer it finds, and leaves a taken one to putWriter.
func (s *Store) takeWriter(ctx context.Context) (*writer, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.closed.Load() {
		return nil, idempotency.ErrStoreClosed
	}
	if w := s.w; w != nil {
		s.w = nil
		return w, nil
	}
	return openWriter(ctx, s.db, s.stmt)
}

// putWriter gives w back to the Store, or closes it when it is broken or
// the Store was closed meanwhile.
func (s *Store) putWriter(w *writer) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if w.broken || s.closed.Load() {
		w.close(w.broken)
		return
	}
	s.w = w
}

// noTransaction reports the error of a ROLLBACK without a transaction.
func noTransaction(err error) bool {
	return code(err) == sqlite3.SQLITE_ERROR && strings.Contains(err.Error(), "no transaction is active")
}
