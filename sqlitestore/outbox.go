package sqlitestore

import (
	"context"
	"database/sql"
	_ "embed"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/outbox/relay"
	"github.com/go-idempotency/idempotency/state"
)

// DefaultOutboxTable is the outbox table (see package outbox) that Open
// creates and Enqueue writes to without WithOutboxTable.
const DefaultOutboxTable = "idempotency_outbox"

// DefaultStateTable is the table of state records (see package state)
// that Open creates, with its history ("<name>_history"), and that
// Store.States uses without state.WithTable.
const DefaultStateTable = "idempotency_state"

//go:embed outbox.sql
var outboxSQL string

//go:embed state.sql
var stateSQL string

// OutboxSchema returns the SQL that creates the outbox table named name
// and its indexes (named after it): the embedded outbox.sql with the names
// put in, quoted. Every statement is idempotent (IF NOT EXISTS). Open runs
// it for WithOutboxTable's table. It panics when name is not a table name
// (see WithTable).
func OutboxSchema(name string) string {
	t := mustTable(name)
	return strings.ReplaceAll(outboxSQL, `"idempotency_outbox`, `"`+t.name)
}

// StateSchema returns the SQL that creates the state records' table named
// name and its history table ("<name>_history"): the embedded state.sql
// with the names put in, quoted. Every statement is idempotent (IF NOT
// EXISTS). Open runs it for DefaultStateTable. It panics when name is not
// a table name (see WithTable).
func StateSchema(name string) string {
	t := mustTable(name)
	return strings.ReplaceAll(stateSQL, `"idempotency_state`, `"`+t.name)
}

// schema is what Open creates: the records' table, the outbox and the
// state records' tables.
func (s *Store) schema() string {
	return Schema(s.cfg.table.name) + "\n" + OutboxSchema(s.cfg.outbox.name) + "\n" + StateSchema(DefaultStateTable)
}

// outboxTable returns the Store's outbox table in the SQLite dialect, its
// statements rendered once.
func (s *Store) outboxTable() *lifecycle.Table {
	s.outboxOnce.Do(func() {
		t, err := lifecycle.New(s.cfg.outbox.name, lifecycle.SQLite)
		if err != nil { // WithOutboxTable checked the name
			panic("sqlitestore: " + err.Error())
		}
		s.outbox = t
	})
	return s.outbox
}

// Outbox returns the request's transaction as the outbox's edges take it,
// and the Store's outbox table (WithOutboxTable): what outbox.Enqueue and
// outbox.Cancel write through, in the handler's transaction, so that the
// messages commit with the record. The relays of the Store (Store.Relay)
// are woken when the transaction commits. It implements
// lifecycle.TxOutbox.
func (h *HandlerTx) Outbox() (lifecycle.DB, *lifecycle.Table) {
	return wroteDB{DB: lifecycle.SQL(h.tx, lifecycle.SQLite), wrote: &h.wroteOutbox}, h.s.outboxTable()
}

// wroteDB notes that a statement that writes ran through it: the commit
// of its transaction then wakes the Store's relays, and one that only
// read (a state record's Get) wakes none.
type wroteDB struct {
	lifecycle.DB
	wrote *atomic.Bool
}

func (d wroteDB) Exec(ctx context.Context, query string, args ...any) error {
	d.wrote.Store(true)
	return d.DB.Exec(ctx, query, args...)
}

func (d wroteDB) Query(ctx context.Context, query string, args ...any) (lifecycle.Rows, error) {
	if !reads(query) {
		d.wrote.Store(true)
	}
	return d.DB.Query(ctx, query, args...)
}

// InTx runs fn in a savepoint of the request's transaction.
func (d wroteDB) InTx(ctx context.Context, fn func(lifecycle.DB) error) error {
	return lifecycle.InTx(ctx, d.DB, func(tx lifecycle.DB) error { return fn(wroteDB{DB: tx, wrote: d.wrote}) })
}

// committedOutbox wakes the Store's relays: a transaction that wrote to
// the outbox committed.
func (s *Store) committedOutbox() {
	s.wakeMu.Lock()
	defer s.wakeMu.Unlock()
	for _, w := range s.wakes {
		select {
		case w <- struct{}{}:
		default: // a wake-up is pending already
		}
	}
}

// wake returns a channel that receives after every commit of messages by
// the Store's transactions, for one relay.
func (s *Store) wake() <-chan struct{} {
	w := make(chan struct{}, 1)
	s.wakeMu.Lock()
	s.wakes = append(s.wakes, w)
	s.wakeMu.Unlock()
	return w
}

// outboxState is the Store's part for its outbox: the table, and the
// relays' wake-ups.
type outboxState struct {
	outboxOnce sync.Once
	outbox     *lifecycle.Table
	wakeMu     sync.Mutex
	wakes      []chan struct{}
}

// Relay returns a relay (package outbox/relay) that publishes the messages
// of the Store's outbox through sink, on the Store's file: its statements
// take the Store's write turn, as the Store's own writers do. It is woken
// in process when a transaction of the Store commits messages, and polls
// (relay.WithPollInterval) for those that other processes commit to the
// file. relay.WithTable and relay.WithListenerConfig do not apply. Run it
// with Run; it panics as relay.NewDB does.
//
// Each call subscribes a channel to the Store's wake-ups for the Store's
// life: make a relay once, and Run it again after it returned.
func (s *Store) Relay(sink outbox.Sink, opts ...relay.Option) *relay.Relay {
	return relay.NewDB(turnDB{s: s}, s.outboxTable(), s.wake(), sink, opts...)
}

// OutboxDB returns the Store's file as the outbox's edges and the state
// records take it (lifecycle.DB, in the SQLite dialect): each statement in
// the Store's write turn, as a transaction of its own, or several in one
// transaction (lifecycle.InTx). Package lifecycle's edges and idemctl's
// read-only queries run on it; States uses it. A statement that writes
// (an operator's resume, requeue or schedule) wakes the Store's relays
// once it committed, as the Store's transactions that write messages do.
func (s *Store) OutboxDB() lifecycle.DB { return turnDB{s: s, wakes: true} }

// States returns the state records (package state) of the Store's file:
// the table of state.WithTable (DefaultStateTable by default; Open creates
// it, StateSchema gives the SQL for another name), their events written to
// the Store's outbox (state.WithOutboxTable does not apply). Inside a
// transactional route or call over the Store each call runs in its
// transaction. It panics as state.NewDB does.
func (s *Store) States(opts ...state.Option) *state.Store {
	opts = append(append([]state.Option{state.WithTable(DefaultStateTable)}, opts...),
		state.WithOutboxTable(s.cfg.outbox.name))
	return state.NewDB(s.OutboxDB(), state.SQLite, opts...)
}

// turnDB runs statements on the Store's file, each that writes in the
// Store's write turn: SQLite takes one writer at a time, and waiting for
// the turn wakes the next one the moment the lock is free, where SQLite's
// busy handler sleeps and polls. A statement that only reads (a SELECT)
// runs beside the writers, on its WAL snapshot. With wakes, a statement
// or transaction that wrote wakes the Store's relays once it committed;
// the relays' own statements do not, or an idle relay would wake itself.
type turnDB struct {
	s     *Store
	wakes bool
}

// wrote wakes the Store's relays after a write that committed, when d
// wakes them.
func (d turnDB) wrote() {
	if d.wakes {
		d.s.committedOutbox()
	}
}

// reads reports whether query only reads: it opens with SELECT, as every
// read-only statement of packages lifecycle and state does.
func reads(query string) bool {
	q := strings.TrimLeft(query, " \t\r\n(")
	return len(q) >= 6 && strings.EqualFold(q[:6], "SELECT")
}

func (d turnDB) Exec(ctx context.Context, query string, args ...any) error {
	if err := d.s.take(ctx); err != nil {
		return err
	}
	err := lifecycle.SQL(d.s.db, lifecycle.SQLite).Exec(ctx, query, args...)
	d.s.give()
	if err == nil {
		d.wrote()
	}
	return err
}

func (d turnDB) Query(ctx context.Context, query string, args ...any) (lifecycle.Rows, error) {
	if reads(query) {
		return lifecycle.SQL(d.s.db, lifecycle.SQLite).Query(ctx, query, args...)
	}
	if err := d.s.take(ctx); err != nil {
		return nil, err
	}
	rows, err := lifecycle.SQL(d.s.db, lifecycle.SQLite).Query(ctx, query, args...)
	if err != nil {
		d.s.give()
		return nil, err
	}
	return &turnRows{Rows: rows, give: sync.OnceFunc(d.s.give), wrote: d.wrote}, nil
}

// InTx runs fn in a transaction of its own (BEGIN IMMEDIATE) in the
// Store's write turn, and commits it when fn returns nil.
func (d turnDB) InTx(ctx context.Context, fn func(lifecycle.DB) error) error {
	if err := d.s.take(ctx); err != nil {
		return err
	}
	err := lifecycle.InTx(ctx, lifecycle.SQL(d.s.db, lifecycle.SQLite), fn)
	d.s.give()
	if err == nil {
		// A transaction of the outbox's edges (a state transition) may
		// have written messages.
		d.wrote()
	}
	return err
}

// turnRows gives the write turn back when the rows are closed, and then,
// when the statement succeeded, calls wrote.
type turnRows struct {
	lifecycle.Rows
	give, wrote func()
	closed      bool
}

func (r *turnRows) Close() error {
	err := r.Rows.Close()
	r.give()
	if !r.closed && err == nil {
		r.wrote()
	}
	r.closed = true
	return err
}

// compile-time checks.
var (
	_ lifecycle.TxOutbox = (*HandlerTx)(nil)
	_ lifecycle.Txer     = turnDB{}
	_ lifecycle.Txer     = wroteDB{}
	_ lifecycle.SQLDB    = (*sql.Tx)(nil)
)
