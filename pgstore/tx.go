package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/jackc/pgx/v5"
)

// ErrHandlerCommit is returned by Commit on the transaction a handler gets
// (TxFromContext): the middleware commits it, together with the record, so
// that the handler's writes and the record land together or not at all.
// To abandon its writes, a handler answers with a status that releases the
// key (a 5xx by default) or panics.
var ErrHandlerCommit = errors.New("pgstore: the handler's transaction is committed by the middleware, with the record")

// BeginTx implements idempotency.TxStore: it begins a transaction on the
// pool (with the options of WithTxOptions, READ COMMITTED by default) for
// the request that holds the record at key with token. ctx bounds the
// BEGIN only. The transaction holds one of the pool's connections until it
// ends, so size the pool for the transactional requests that run at once
// plus the store's own statements.
func (s *Store) BeginTx(ctx context.Context, key, token string) (idempotency.Tx, error) {
	if err := s.check(key, token); err != nil {
		return nil, err
	}
	tx, err := s.pool.BeginTx(ctx, s.cfg.txOptions)
	if err != nil {
		return nil, fmt.Errorf("pgstore: begin: %w", err)
	}
	return &Tx{s: s, tx: tx, key: key, token: token}, nil
}

// Tx is one request's transaction, begun by Store.BeginTx. It implements
// idempotency.Tx.
type Tx struct {
	s          *Store
	tx         pgx.Tx
	key, token string

	mu   sync.Mutex
	done bool // committed or rolled back
}

var _ idempotency.Tx = (*Tx)(nil)

// Handle returns the transaction as a pgx.Tx, which the middleware puts in
// the handler's context (idempotency.Info.Tx; TxFromContext reads it). Its
// Commit returns ErrHandlerCommit; everything else is the transaction's
// own. It also has a method OutboxTable, the Store's (see
// Store.OutboxTable), by which outbox.Enqueue finds the table to write to.
func (t *Tx) Handle() any { return handlerTx{t.tx, t.s.OutboxTable()} }

// Complete writes resp as the record's COMPLETE payload, kept for ttl from
// now, inside the transaction, and commits. The write is the fence: an
// UPDATE of the record's row where it is still IN_PROGRESS under the
// token given to BeginTx and not expired. When it updates no row (the
// record was stolen, completed or released) the transaction is rolled back
// and Complete returns idempotency.ErrLeaseLost. A record already COMPLETE
// under the same token counts as lost too: committing would write the
// handler's effects a second time. A row that is not a record gives an
// error wrapping idempotency.ErrCorruptRecord, also rolled back. Any other
// error (the connection broke, the COMMIT failed, ctx ended) leaves the
// outcome unknown to the caller: both the record and the handler's writes
// committed, or neither did.
func (t *Tx) Complete(ctx context.Context, resp *idempotency.Response, ttl time.Duration) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return fmt.Errorf("pgstore: complete %s: %w", t.key, pgx.ErrTxClosed)
	}
	code, state, err := t.s.complete(ctx, t.tx, t.key, t.token, resp, ttl)
	if err == nil && code != fencedDone {
		switch code {
		case fencedLost, fencedAlready:
			err = idempotency.ErrLeaseLost
		case codeCorrupt:
			err = corruptState(t.key, state)
		default:
			err = fmt.Errorf("pgstore: complete %s: unexpected answer %d", t.key, code)
		}
	}
	if err != nil {
		t.rollbackLocked(ctx)
		return err
	}
	if t.s.beforeCommit != nil {
		t.s.beforeCommit(t)
	}
	t.done = true
	if err := t.tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgstore: commit %s: %w", t.key, err)
	}
	return nil
}

// Rollback abandons the transaction. It returns nil once the transaction
// has ended (committed by Complete, or rolled back), however often it is
// called.
func (t *Tx) Rollback(ctx context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.rollbackLocked(ctx)
}

func (t *Tx) rollbackLocked(ctx context.Context) error {
	if t.done {
		return nil
	}
	t.done = true
	err := t.tx.Rollback(ctx)
	if err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("pgstore: rollback %s: %w", t.key, err)
	}
	return nil
}

// handlerTx is the transaction as the handler sees it: Commit is the
// middleware's.
type handlerTx struct {
	pgx.Tx
	outbox string
}

// OutboxTable returns the outbox table of the Store that began the
// transaction (see Store.OutboxTable).
func (t handlerTx) OutboxTable() string { return t.outbox }

// Commit refuses: see ErrHandlerCommit.
func (handlerTx) Commit(context.Context) error { return ErrHandlerCommit }

// TxFromContext returns the transaction of the request whose handler runs
// with ctx, on a route with idempotency.WithTransaction over a Store: the
// pgx.Tx to write with, committed by the middleware together with the
// record. It returns false elsewhere.
func TxFromContext(ctx context.Context) (pgx.Tx, bool) {
	info, ok := idempotency.FromContext(ctx)
	if !ok {
		return nil, false
	}
	tx, ok := info.Tx.(pgx.Tx)
	return tx, ok
}
