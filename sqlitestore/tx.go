package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-idempotency/idempotency"
)

// BeginTx implements idempotency.TxStore: it begins a BEGIN IMMEDIATE
// transaction for the request that holds the record at key with token.
// The transaction holds the file's write lock until it ends, so
// transactional handlers on one file run one at a time, and every other
// write of the Store (the acquire of a new key, a complete, a release, an
// extend of another key) waits for the handler to return; the heartbeat's
// extends of key itself run inside the transaction (see Store.Extend). It
// runs on the connection of the Store's own writes, which waits for the
// write turn anyway, and takes none of WithMaxConns's.
//
// ctx bounds the begin only: the wait for the Store's write turn, which a
// running transactional handler holds (the middleware gives it a third of
// the lease, then answers 503 and releases the key), and for a connection.
// BEGIN IMMEDIATE then waits for a writer of another process, or of the
// application's own transactions on DB, for at most the busy timeout
// (WithBusyTimeout), and fails with SQLITE_BUSY after it. Keep
// transactional handlers short, since every writer waits for them: in
// this process, for as long as its context allows; in another, for the
// busy timeout.
func (s *Store) BeginTx(ctx context.Context, key, token string) (idempotency.Tx, error) {
	if err := s.check(key, token); err != nil {
		return nil, err
	}
	if err := s.take(ctx); err != nil {
		return nil, opError("begin", key, err)
	}
	w, err := s.takeWriter(ctx)
	if err != nil {
		s.give()
		return nil, opError("begin", key, err)
	}
	// The transaction outlives ctx: database/sql would roll it back when
	// the context it began with ends. It is a *sql.Tx, not the writer's
	// prepared BEGIN, for what the handler's statements get from one:
	// those it prepared are closed and its open rows end with it, and a
	// call after it ended fails with sql.ErrTxDone.
	tx, err := w.conn.BeginTx(context.WithoutCancel(ctx), nil)
	if err != nil {
		s.putWriter(w)
		s.give()
		return nil, opError("begin", key, err)
	}
	t := &Tx{s: s, w: w, tx: tx, key: key, token: token, handle: &HandlerTx{tx: tx, s: s}}
	s.txMu.Lock()
	s.txs[key] = t
	s.txMu.Unlock()
	return t, nil
}

// openTx returns the open transaction of key, or nil.
func (s *Store) openTx(key string) *Tx {
	s.txMu.Lock()
	defer s.txMu.Unlock()
	return s.txs[key]
}

// Tx is one request's transaction, begun by Store.BeginTx. It implements
// idempotency.Tx.
type Tx struct {
	s          *Store
	w          *writer // the Store's, taken until the transaction ends
	tx         *sql.Tx
	key, token string
	handle     *HandlerTx

	mu   sync.Mutex
	done bool // committed or rolled back
}

var _ idempotency.Tx = (*Tx)(nil)

// Handle returns the transaction as the handler writes with it: a
// *HandlerTx, which the middleware puts in the handler's context
// (idempotency.Info.Tx; TxFromContext reads it).
func (t *Tx) Handle() any { return t.handle }

// Complete writes resp as the record's COMPLETE payload, kept for ttl from
// now, inside the transaction, and commits. The write is the fence: an
// UPDATE of the record's row where it is still IN_PROGRESS under the
// token given to BeginTx and not expired (the row is read first, under the
// transaction's write lock, to tell a row that is not a record). When the
// record is not, or no longer, so (it was stolen before the transaction
// began, released, completed, or it expired) the transaction is rolled
// back, the handler's writes with it, and Complete returns
// idempotency.ErrLeaseLost; a row that is not a
// record gives an error wrapping idempotency.ErrCorruptRecord, also rolled
// back. Any other error (ctx ended, the COMMIT failed) leaves the outcome
// unknown to the caller: both the record and the handler's writes
// committed, or neither did. After the COMMIT it wakes the key's waiters.
func (t *Tx) Complete(ctx context.Context, resp *idempotency.Response, ttl time.Duration) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return opError("complete", t.key, sql.ErrTxDone)
	}
	if ttl <= 0 {
		t.endLocked(false)
		return fmt.Errorf("sqlitestore: TTL %v must be positive", ttl)
	}
	e, err := encode(resp)
	if err != nil {
		t.endLocked(false)
		return err
	}
	// The transaction holds the write lock: the row read here is the one
	// the fence judges. The read tells a row that is not a record, which
	// the fence alone could match. Under the lock the statements wait for
	// nothing, and run without ctx's cancellation, as the Store's own
	// writes do (see Store.write); a ctx that ended before the COMMIT
	// rolls the transaction back.
	in := context.WithoutCancel(ctx)
	now := t.s.now()
	r, err := t.s.readIn(in, t.tx.StmtContext, t.key)
	switch {
	case err != nil:
	case !r.held(t.token, now):
		err = idempotency.ErrLeaseLost
	default:
		if err = t.s.fence(in, t.tx.StmtContext, t.key, t.token, e, ttl, now); errors.Is(err, errFenced) {
			err = idempotency.ErrLeaseLost
		} else if err == nil && ctx.Err() != nil {
			err = fmt.Errorf("before commit: %w", context.Cause(ctx))
		}
	}
	if err != nil {
		t.endLocked(false)
		return opError("complete", t.key, err)
	}
	if t.s.beforeCommit != nil {
		t.s.beforeCommit(t)
	}
	if err := t.endLocked(true); err != nil {
		return fmt.Errorf("sqlitestore: commit %s: %w", t.key, err)
	}
	t.s.hub.wake(t.key)
	return nil
}

// Rollback abandons the transaction. It returns nil once the transaction
// has ended (committed by Complete, or rolled back), however often it is
// called.
func (t *Tx) Rollback(ctx context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return nil
	}
	if err := t.endLocked(false); err != nil {
		return fmt.Errorf("sqlitestore: rollback %s: %w", t.key, err)
	}
	return nil
}

// endLocked commits or rolls back, then gives the writer and the write
// turn back. t.mu is held. When the COMMIT or the ROLLBACK failed, the
// writer's own ROLLBACK ends what SQLite may have left open (see
// writer.abort).
func (t *Tx) endLocked(commit bool) error {
	t.done = true
	var err error
	if commit {
		err = t.tx.Commit()
	} else if err = t.tx.Rollback(); errors.Is(err, sql.ErrTxDone) {
		err = nil
	}
	if err != nil {
		t.w.abort(context.Background())
	}
	t.s.txMu.Lock()
	if t.s.txs[t.key] == t {
		delete(t.s.txs, t.key)
	}
	t.s.txMu.Unlock()
	t.s.putWriter(t.w)
	t.s.give()
	if commit && err == nil && t.handle.wroteOutbox.Load() {
		t.s.committedOutbox()
	}
	return err
}

// extend runs the extend edge inside the transaction, for Store.Extend. It
// reports false when it did not run: the transaction has ended, or it is
// another token's, and the caller extends on its own.
func (t *Tx) extend(ctx context.Context, token string, lease time.Duration) (ran bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done || token != t.token {
		return false, nil
	}
	_, err = t.s.extend(ctx, t.tx.StmtContext, t.key, token, lease, t.s.now())
	return true, err
}

// HandlerTx is the request's transaction as its handler sees it: the
// statements of a *sql.Tx (the method set of sqlc's DBTX), and no Commit
// or Rollback, since the middleware commits it together with the record.
// To abandon its writes, a handler answers with a status that releases
// the key (a 5xx by default) or panics. Its statements must not end the
// transaction either (COMMIT, END, ROLLBACK without TO).
type HandlerTx struct {
	tx *sql.Tx
	s  *Store
	// wroteOutbox is set once Outbox was called: the commit wakes the
	// Store's relays.
	wroteOutbox atomic.Bool
}

// ExecContext runs a statement that returns no rows in the transaction.
func (h *HandlerTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return h.tx.ExecContext(ctx, query, args...)
}

// QueryContext runs a query in the transaction.
func (h *HandlerTx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return h.tx.QueryContext(ctx, query, args...)
}

// QueryRowContext runs a query that returns at most one row in the
// transaction.
func (h *HandlerTx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return h.tx.QueryRowContext(ctx, query, args...)
}

// PrepareContext prepares a statement for use in the transaction.
func (h *HandlerTx) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	return h.tx.PrepareContext(ctx, query)
}

// TxFromContext returns the transaction of the request whose handler runs
// with ctx, on a route with idempotency.WithTransaction over a Store,
// committed by the middleware together with the record. It returns false
// elsewhere.
func TxFromContext(ctx context.Context) (*HandlerTx, bool) {
	info, ok := idempotency.FromContext(ctx)
	if !ok {
		return nil, false
	}
	h, ok := info.Tx.(*HandlerTx)
	return h, ok
}
