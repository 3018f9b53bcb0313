// Package sqlitefloor is the record floor of SQLite, which sqlitestore is
// measured against over HTTP (httpbench) and in process (sqlitebench): the
// store's round trips done by hand with plain statements, checking
// nothing, on a file of its own opened by sqlitestore.Open, so with the
// store's settings (WAL, synchronous=FULL, BEGIN IMMEDIATE) and its table
// (the same columns and indexes). Times are unix microseconds from Go's
// clock, as the store computes them. Its statements on the records are
// prepared once, as the store's are, so that the floor pays for no parsing
// the store does not pay for; the transactional handler's own INSERT runs
// as the handler on the store runs it, unprepared. Its writes take turns
// under a lock, as the store's writers do, rather than in SQLite's busy
// handler.
package sqlitefloor

import (
	"context"
	"database/sql"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// The floor's statements on the store's default table, and the payments'
// table and row of a transactional handler.
const (
	readSQL = `SELECT status, headers, body FROM idempotency_records WHERE key = ?1`
	newSQL  = `INSERT INTO idempotency_records (key, state, token, fingerprint, epoch, lease_until, ttl_until, expires_at, updated_at)
VALUES (?1, 'in_progress', ?2, ?3, 1, ?4, ?5, max(?4, ?5), ?6)`
	doneSQL = `UPDATE idempotency_records SET state = 'complete', status = ?2, headers = ?3, body = ?4, body_omitted = 0,
	ttl_until = ?5, expires_at = ?5, updated_at = ?6 WHERE key = ?1`
	// PaymentsSQL creates the payments' table.
	PaymentsSQL = `CREATE TABLE payments (id INTEGER PRIMARY KEY, idem_key TEXT NOT NULL, amount INTEGER NOT NULL)`
	// PaymentSQL is a transactional handler's write: ?1 the key, ?2 the
	// amount.
	PaymentSQL = `INSERT INTO payments (idem_key, amount) VALUES (?1, ?2)`
)

// Record is what the floor's records hold: the request's fingerprint, the
// response's status-and-headers block and body, and how long the lease and
// the record last.
type Record struct {
	Fingerprint, Header, Body []byte
	Lease, TTL                time.Duration
}

// Floor is the record floor on one file.
type Floor struct {
	rec                Record
	read, create, done *sql.Stmt
	db                 *sql.DB
	tokens             atomic.Int64
	writer             sync.Mutex
}

// New makes the payments' table in the file of db, whose records' table
// sqlitestore.Open made, and prepares the floor's statements.
func New(ctx context.Context, db *sql.DB, rec Record) (*Floor, error) {
	if _, err := db.ExecContext(ctx, PaymentsSQL); err != nil {
		return nil, err
	}
	f := &Floor{rec: rec, db: db}
	for _, p := range []struct {
		stmt **sql.Stmt
		sql  string
	}{{&f.read, readSQL}, {&f.create, newSQL}, {&f.done, doneSQL}} {
		var err error
		if *p.stmt, err = db.PrepareContext(ctx, p.sql); err != nil {
			f.Close()
			return nil, err
		}
	}
	return f, nil
}

// Close closes the floor's statements.
func (f *Floor) Close() {
	for _, s := range []*sql.Stmt{f.read, f.create, f.done} {
		if s != nil {
			s.Close()
		}
	}
}

// Read reads key's stored response: one SELECT by primary key. It returns
// the body.
func (f *Floor) Read(ctx context.Context, key string) ([]byte, error) {
	var status int
	var header, body []byte
	err := f.read.QueryRowContext(ctx, key).Scan(&status, &header, &body)
	return body, err
}

// Create inserts key's in-progress row: a write transaction of its own,
// in the floor's turn.
func (f *Floor) Create(ctx context.Context, key string) error {
	f.writer.Lock()
	defer f.writer.Unlock()
	now := time.Now()
	_, err := f.create.ExecContext(ctx, key, strconv.FormatInt(f.tokens.Add(1), 16), f.rec.Fingerprint,
		now.Add(f.rec.Lease).UnixMicro(), now.Add(f.rec.TTL).UnixMicro(), now.UnixMicro())
	return err
}

// Store stores the response in key's row: a write transaction of its own,
// in the floor's turn.
func (f *Floor) Store(ctx context.Context, key string) error {
	f.writer.Lock()
	defer f.writer.Unlock()
	return f.complete(ctx, f.done, key)
}

// StoreWithPayment is a transactional route's commit: in the floor's turn,
// one BEGIN IMMEDIATE transaction holding the payment's INSERT (key,
// amount) and the UPDATE that stores the response in key's row.
func (f *Floor) StoreWithPayment(ctx context.Context, key string, amount int) error {
	f.writer.Lock()
	defer f.writer.Unlock()
	tx, err := f.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, PaymentSQL, key, amount); err != nil {
		tx.Rollback()
		return err
	}
	if err := f.complete(ctx, tx.StmtContext(ctx, f.done), key); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// complete runs done, the UPDATE that stores the response in key's row.
func (f *Floor) complete(ctx context.Context, done *sql.Stmt, key string) error {
	now := time.Now()
	_, err := done.ExecContext(ctx, key, http.StatusCreated, f.rec.Header, f.rec.Body, now.Add(f.rec.TTL).UnixMicro(), now.UnixMicro())
	return err
}
