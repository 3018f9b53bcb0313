package lifecycle

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is the database handle an edge runs on: a pool (each statement its
// own transaction), a connection, or a transaction, so that an edge can
// run in a caller's transaction (outbox.Enqueue in the route's, a local
// run's done mark in the function's). Pgx makes one of a pgx handle, SQL
// one of a database/sql handle.
type DB interface {
	// Exec runs a statement whose rows, if any, are not read.
	Exec(ctx context.Context, sql string, args ...any) error
	// Query runs a statement and returns its rows.
	Query(ctx context.Context, sql string, args ...any) (Rows, error)
}

// Rows are the rows of a statement, read as database/sql reads them: Next
// before each row, Scan, and Close, which returns the error that ended
// them (Err's).
type Rows interface {
	Next() bool
	Scan(dst ...any) error
	Err() error
	Close() error
}

// TxOutbox is the transaction of a transactional route or call
// (idempotency.Info.Tx) of a store that keeps its outbox table in the
// same database, as sqlitestore's is: Outbox returns the transaction as a
// DB, and the table. outbox.Enqueue and outbox.Cancel write through it.
type TxOutbox interface {
	Outbox() (DB, *Table)
}

// Txer is a DB that runs several statements all together or not at all:
// InTx begins a transaction, runs fn on it, and commits it when fn returns
// nil (else rolls it back); on a transaction's DB, in a savepoint of it.
type Txer interface {
	InTx(ctx context.Context, fn func(DB) error) error
}

// InTx runs fn all together or not at all when db is a Txer (the DBs of
// Pgx and SQL are: a transaction of its own, or a savepoint of db's), or
// else on db as it is.
func InTx(ctx context.Context, db DB, fn func(DB) error) error {
	if t, ok := db.(Txer); ok {
		return t.InTx(ctx, fn)
	}
	return fn(db)
}

// ErrNoRows is the error of a statement read for one row that returned
// none.
var ErrNoRows = errors.New("lifecycle: no rows")

// PgxDB is a pgx handle: *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type PgxDB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// compile-time check that the handles the package documents satisfy PgxDB.
var _ PgxDB = pgx.Tx(nil)

// Pgx returns db as a DB, for the PostgreSQL dialect. Statements that an
// edge sends together (Enqueue's lock, insert and notification) go in one
// round trip, as a pgx batch.
func Pgx(db PgxDB) DB { return pgxDB{db} }

type pgxDB struct{ db PgxDB }

func (p pgxDB) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := p.db.Exec(ctx, sql, args...)
	return err
}

func (p pgxDB) Query(ctx context.Context, sql string, args ...any) (Rows, error) {
	rows, err := p.db.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgxRows{rows}, nil
}

// InTx runs fn in a transaction begun on the handle (a savepoint in a
// transaction's: pgx.Tx's Begin), or on the handle itself when it cannot
// begin one.
func (p pgxDB) InTx(ctx context.Context, fn func(DB) error) error {
	b, ok := p.db.(interface {
		Begin(ctx context.Context) (pgx.Tx, error)
	})
	if !ok {
		return fn(p)
	}
	return pgx.BeginFunc(ctx, b, func(tx pgx.Tx) error { return fn(pgxDB{tx}) })
}

// batch sends stmts in one round trip.
func (p pgxDB) batch(ctx context.Context, stmts []stmt) error {
	b := &pgx.Batch{}
	for _, s := range stmts {
		q := b.Queue(s.sql, s.args...)
		if s.rows != nil {
			read := s.rows
			q.Query(func(rows pgx.Rows) error { return read(pgxRows{rows}) })
		}
	}
	return p.db.SendBatch(ctx, b).Close()
}

type pgxRows struct{ pgx.Rows }

func (r pgxRows) Close() error {
	r.Rows.Close()
	return r.Rows.Err()
}

// SQLDB is a database/sql handle: *sql.DB, *sql.Conn and *sql.Tx satisfy
// it.
type SQLDB interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// SQL returns db as a DB in the dialect d: the arguments of its statements
// are converted by d.Arg, and the times they return read by d.Time, where
// the dialect sets them.
func SQL(db SQLDB, d Dialect) DB { return sqlDB{db: db, d: d} }

type sqlDB struct {
	db SQLDB
	d  Dialect
}

func (s sqlDB) args(args []any) []any {
	if s.d.Arg == nil {
		return args
	}
	out := make([]any, len(args))
	for i, a := range args {
		out[i] = s.d.Arg(a)
	}
	return out
}

func (s sqlDB) Exec(ctx context.Context, query string, args ...any) error {
	_, err := s.db.ExecContext(ctx, query, s.args(args)...)
	return err
}

func (s sqlDB) Query(ctx context.Context, query string, args ...any) (Rows, error) {
	rows, err := s.db.QueryContext(ctx, query, s.args(args)...)
	if err != nil {
		return nil, err
	}
	return sqlRows{Rows: rows, time: s.d.Time}, nil
}

// InTx runs fn in a transaction begun on the handle, or, on a handle
// that is a transaction already, in a savepoint of it: fn's statements
// take effect all together or not at all, either way.
func (s sqlDB) InTx(ctx context.Context, fn func(DB) error) error {
	b, ok := s.db.(interface {
		BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
	})
	if !ok {
		return s.inSavepoint(ctx, fn)
	}
	tx, err := b.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(sqlDB{db: tx, d: s.d}); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// inSavepoint runs fn in a savepoint of the handle's transaction, rolled
// back to when fn fails.
func (s sqlDB) inSavepoint(ctx context.Context, fn func(DB) error) error {
	if _, err := s.db.ExecContext(ctx, "SAVEPOINT lifecycle"); err != nil {
		return err
	}
	if err := fn(s); err != nil {
		if _, rerr := s.db.ExecContext(context.WithoutCancel(ctx), "ROLLBACK TO lifecycle; RELEASE lifecycle"); rerr != nil {
			return errors.Join(err, fmt.Errorf("roll back to the savepoint: %w", rerr))
		}
		return err
	}
	_, err := s.db.ExecContext(ctx, "RELEASE lifecycle")
	return err
}

type sqlRows struct {
	*sql.Rows
	time func(src any) (time.Time, error)
}

// Scan reads the row into dst, the times through the dialect's Time.
func (r sqlRows) Scan(dst ...any) error {
	if r.time == nil {
		return r.Rows.Scan(dst...)
	}
	cells := make([]any, len(dst))
	for i, d := range dst {
		switch d := d.(type) {
		case *time.Time:
			cells[i] = timeCell{t: d, conv: r.time}
		case **time.Time:
			cells[i] = timeCell{pt: d, conv: r.time}
		default:
			cells[i] = d
		}
	}
	return r.Rows.Scan(cells...)
}

// timeCell is a sql.Scanner of a time, or a nullable time (pt), that the
// dialect's conv reads.
type timeCell struct {
	t    *time.Time
	pt   **time.Time
	conv func(src any) (time.Time, error)
}

func (c timeCell) Scan(src any) error {
	if src == nil {
		if c.pt == nil {
			return errors.New("a NULL time")
		}
		*c.pt = nil
		return nil
	}
	t, err := c.conv(src)
	if err != nil {
		return err
	}
	if c.pt != nil {
		*c.pt = &t
	} else {
		*c.t = t
	}
	return nil
}

// stmt is one statement of several that an edge sends together: rows, when
// set, reads its rows.
type stmt struct {
	sql  string
	args []any
	rows func(Rows) error
}

// batcher is a DB that sends several statements in one round trip.
type batcher interface {
	batch(ctx context.Context, stmts []stmt) error
}

// run runs stmts on db: in one round trip where db can, else one after
// the other.
func run(ctx context.Context, db DB, stmts []stmt) error {
	if b, ok := db.(batcher); ok {
		return b.batch(ctx, stmts)
	}
	for _, s := range stmts {
		if s.rows == nil {
			if err := db.Exec(ctx, s.sql, s.args...); err != nil {
				return err
			}
			continue
		}
		rows, err := db.Query(ctx, s.sql, s.args...)
		if err != nil {
			return err
		}
		err = s.rows(rows)
		if cerr := rows.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// QueryRow runs a statement on db and reads its first row into dst. It
// returns ErrNoRows when the statement returned none.
func QueryRow(ctx context.Context, db DB, sql string, args []any, dst ...any) error {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Close(); err != nil {
			return err
		}
		return ErrNoRows
	}
	if err := rows.Scan(dst...); err != nil {
		return err
	}
	return rows.Close()
}

// forEach reads each row of rows into dst, calling f after each, and
// closes them.
func forEach(rows Rows, dst []any, f func() error) error {
	defer rows.Close()
	for rows.Next() {
		if err := rows.Scan(dst...); err != nil {
			return err
		}
		if err := f(); err != nil {
			return err
		}
	}
	return rows.Close()
}

// Collect reads every row of rows with read, and closes them.
func Collect[T any](rows Rows, read func(Rows) (T, error)) ([]T, error) {
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := read(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	return out, nil
}

// scanOne reads a row of one column into a T.
func scanOne[T any](rows Rows) (T, error) {
	var v T
	err := rows.Scan(&v)
	return v, err
}

// cell is a sql.Scanner that keeps the value the driver gives, whatever
// it is, so that a row's columns are read one by one (see decodeClaimed).
type cell struct{ v any }

func (c *cell) Scan(src any) error {
	if b, ok := src.([]byte); ok { // the driver may reuse its buffer
		src = append([]byte(nil), b...)
	}
	c.v = src
	return nil
}

// newCells returns n cells and the destinations of a Scan into them.
func newCells(n int) ([]cell, []any) {
	cells := make([]cell, n)
	dst := make([]any, n)
	for i := range cells {
		dst[i] = &cells[i]
	}
	return cells, dst
}

// errNull is the error of a NULL where a column holds a value.
var errNull = errors.New("is NULL")

// errNotA is the error of a cell of another type than the column's.
func errNotA(what string, v any) error {
	if v == nil {
		return errNull
	}
	return fmt.Errorf("is a %T, not %s", v, what)
}
