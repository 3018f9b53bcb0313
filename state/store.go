package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/pgstore"
)

// DB is the database handle a Store runs its statements on, in the
// engine of its dialect: the outbox's lifecycle.DB.
type DB = lifecycle.DB

// maxAttempts bounds how many times a statement runs when the record
// changed between its snapshot and its write (see Transition and Create).
// Each run after the first follows a commit on the record, so a second run
// nearly always settles it.
const maxAttempts = 8

// errChanging is the error of a call whose record kept changing under its
// statement for maxAttempts runs.
var errChanging = errors.New("the record kept changing under the statement")

// Store is the state records of a database, and their events in its
// outbox. It is safe for concurrent use. Create it with New.
type Store struct {
	db   DB
	cfg  config
	vars vars
	sql  statements
	// moves are the transition's statements by outbox table name (see
	// transitionStatement).
	moves sync.Map // string -> *move
}

// move is the transition's statement on one outbox table, or its steps
// (Dialect.Steps).
type move struct {
	sql    string
	steps  steps
	outbox *lifecycle.Table
}

// New returns a Store of the records in the table of WithTable
// (pgstore.DefaultStateTable by default) of the PostgreSQL database db
// connects to: a pool, or a connection (*pgxpool.Pool, *pgx.Conn); create
// the tables first with pgstore.Migrate or the SQL of pgstore.StateSchema.
// Inside a transactional route or call (idempotency.WithTransaction(true)
// over a pgstore.Store) each call runs in its transaction instead, found
// in its context. New makes no connection. It panics when db is nil or an
// option is invalid.
func New(db lifecycle.PgxDB, opts ...Option) *Store {
	if db == nil {
		panic("state: New: nil DB")
	}
	return NewDB(lifecycle.Pgx(db), PostgreSQL, opts...)
}

// NewDB returns a Store of the records in the table of WithTable of the
// database db is, in the dialect d: what sqlitestore's Store.States calls
// for a SQLite file (with the SQLite dialect), or New for PostgreSQL.
// Inside a transactional route or call over a store of the same engine,
// each call runs in its transaction instead. It panics when db is nil or
// an option is invalid.
func NewDB(db DB, d Dialect, opts ...Option) *Store {
	if db == nil {
		panic("state: NewDB: nil DB")
	}
	cfg := newConfig(opts)
	cfg.dialect = d
	v := vars{T: cfg.table.Quoted(), H: mustTable(pgstore.StateHistoryTable(cfg.table.String())).Quoted()}
	sql, err := newStatements(cfg.dialect, v)
	if err != nil {
		panic(err.Error())
	}
	s := &Store{db: db, cfg: cfg, vars: v, sql: sql}
	if _, err := s.move(cfg.outbox); err != nil { // WithOutboxTable checked the name
		panic(err.Error())
	}
	return s
}

// move returns the transition's statement on the outbox table named name.
func (s *Store) move(name string) (*move, error) {
	if m, ok := s.moves.Load(name); ok {
		return m.(*move), nil
	}
	out, err := lifecycle.New(name, s.cfg.dialect.Outbox)
	if err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	mv := &move{outbox: out}
	if s.cfg.dialect.Steps {
		mv.steps, err = newSteps(s.cfg.dialect, s.vars, out)
	} else {
		mv.sql, err = transitionStatement(s.cfg.dialect, s.vars, out)
	}
	if err != nil {
		return nil, err
	}
	m, _ := s.moves.LoadOrStore(name, mv)
	return m.(*move), nil
}

// on returns the handle that the statements of a call with ctx run on, and
// the outbox table that its transitions write to: the transaction of the
// transactional route or call whose context ctx is (idempotency.Info.Tx),
// with its store's outbox, or else the Store's DB and WithOutboxTable's.
// A route's transaction on another engine than the Store's dialect is an
// error: the call cannot be part of it.
func (s *Store) on(ctx context.Context) (DB, string, error) {
	info, ok := idempotency.FromContext(ctx)
	if !ok {
		return s.db, s.cfg.outbox, nil
	}
	switch tx := info.Tx.(type) {
	case lifecycle.TxOutbox:
		db, table := tx.Outbox()
		if got := table.Dialect().Name; got != s.cfg.dialect.Outbox.Name {
			return nil, "", fmt.Errorf("the route's transaction is on %s, the Store on %s", got, s.cfg.dialect.Name)
		}
		return db, table.Name(), nil
	case lifecycle.PgxDB:
		if s.cfg.dialect.Outbox.Name != lifecycle.PostgreSQL.Name {
			return nil, "", fmt.Errorf("the route's transaction is on %s, the Store on %s", lifecycle.PostgreSQL.Name, s.cfg.dialect.Name)
		}
		name := s.cfg.outbox
		if o, ok := info.Tx.(interface{ OutboxTable() string }); ok {
			name = o.OutboxTable()
		}
		return lifecycle.Pgx(tx), name, nil
	}
	return s.db, s.cfg.outbox, nil
}

// Create stores a record at ref in state st, at version 1, with data (nil
// for the JSON object {}). It writes no event and no history: a creation
// is not a transition. A record already at ref is an *ExistsError carrying
// it, and nothing changes. Arguments outside the grammar (see ValidScope,
// ValidMachine, ValidID, ValidState; data JSON within WithMaxDataBytes)
// are an *InvalidArgumentError before any statement runs; a failed
// statement is a *StoreError.
func (s *Store) Create(ctx context.Context, ref Ref, st string, data json.RawMessage) (Record, error) {
	if err := validRef(ref); err != nil {
		return Record{}, err
	}
	if err := ValidState(st); err != nil {
		return Record{}, err
	}
	if data == nil {
		data = json.RawMessage("{}")
	}
	if err := validData(data, s.cfg.maxData); err != nil {
		return Record{}, err
	}
	db, _, err := s.on(ctx)
	if err != nil {
		return Record{}, storeError("create", err)
	}
	for range maxAttempts {
		rec := Record{Ref: ref}
		var stored []byte
		err := lifecycle.QueryRow(ctx, db, s.sql.create, []any{ref.Scope, ref.Machine, ref.ID, st, string(data)},
			&rec.State, &rec.Version, &stored, &rec.CreatedAt, &rec.UpdatedAt)
		rec.Data = stored
		switch {
		case err == nil:
			return rec, nil
		case !errors.Is(err, lifecycle.ErrNoRows):
			return Record{}, storeError("create", err)
		}
		cur, err := s.get(ctx, db, ref)
		var notFound *NotFoundError
		switch {
		case errors.As(err, &notFound):
			continue // gone again: its creator rolled back, or a snapshot older than it
		case err != nil:
			return Record{}, err
		}
		return Record{}, &ExistsError{Current: cur}
	}
	return Record{}, storeError("create", errChanging)
}

// Get reads the record at ref: a *NotFoundError when there is none.
func (s *Store) Get(ctx context.Context, ref Ref) (Record, error) {
	if err := validRef(ref); err != nil {
		return Record{}, err
	}
	db, _, err := s.on(ctx)
	if err != nil {
		return Record{}, storeError("get", err)
	}
	return s.get(ctx, db, ref)
}

func (s *Store) get(ctx context.Context, db DB, ref Ref) (Record, error) {
	rec := Record{Ref: ref}
	var data []byte
	err := lifecycle.QueryRow(ctx, db, s.sql.get, []any{ref.Scope, ref.Machine, ref.ID},
		&rec.State, &rec.Version, &data, &rec.CreatedAt, &rec.UpdatedAt)
	rec.Data = data
	switch {
	case errors.Is(err, lifecycle.ErrNoRows):
		return Record{}, &NotFoundError{Ref: ref}
	case err != nil:
		return Record{}, storeError("get", err)
	}
	return rec, nil
}

// Transition moves the record at ref from c.From to c.To when it is in
// c.From at version c.ExpectedVersion: a compare-and-swap. It bumps the
// version, replaces the data when c.Data is not nil, and writes the
// transition's event into the outbox and its row into the record's
// history, all in one statement: a transaction of its own, or, inside a
// transactional route or call, a part of its transaction, committed with
// the handler's writes and the idempotency record, or not at all. It
// returns the record as the transition left it.
//
// When the record is not at c.ExpectedVersion, the error is a
// *ConflictError with Reason ReasonVersion; when it is, but not in
// c.From, ReasonState; either carries the record as it was found (read by
// a second statement, after the first moved nothing), and nothing was
// written. Two transitions racing from one version never both
// succeed: the second waits for the first's row lock, then finds the new
// version. No record is a *NotFoundError; arguments outside the grammar an
// *InvalidArgumentError, before any statement runs; a failed statement a
// *StoreError (see its documentation in a caller's transaction).
//
// The event (see Event) is the message EventID(ref, version) of topic
// "<WithTopicPrefix>.<machine>", ordering key "<scope>/<machine>/<id>":
// the relays publish a record's events one at a time, in version order. Its
// Cause is taken from ctx: the idempotency key, storage key and epoch of
// the request or call (idempotency.FromContext), and the trace context
// (WithTraceContext), which also goes into the message's headers.
func (s *Store) Transition(ctx context.Context, ref Ref, c Change) (Record, error) {
	if err := validRef(ref); err != nil {
		return Record{}, err
	}
	if err := validChange(c, s.cfg.maxData); err != nil {
		return Record{}, err
	}
	db, outboxName, err := s.on(ctx)
	if err != nil {
		return Record{}, storeError("transition", err)
	}
	m, err := s.move(outboxName)
	if err != nil {
		return Record{}, storeError("transition", err)
	}
	ev := s.event(ctx, ref, c)
	msg, err := s.message(ev)
	if err != nil {
		return Record{}, storeError("transition", err)
	}
	var data any // NULL keeps the stored data
	if c.Data != nil {
		data = string(c.Data)
	}
	for range maxAttempts {
		rec := Record{Ref: ref}
		var written int64
		args := []any{ref.Scope, ref.Machine, ref.ID, c.From, c.To, c.ExpectedVersion, data,
			msg.key, msg.cause, msg.topic, msg.payload, msg.headers, msg.orderingKey}
		var err error
		if m.steps.move != "" {
			err = s.transitionSteps(ctx, db, m, args, &rec, &written)
		} else {
			var data []byte
			err = lifecycle.QueryRow(ctx, db, m.sql, args, &rec.State, &rec.Version, &data, &rec.CreatedAt, &rec.UpdatedAt, &written)
			rec.Data = data
		}
		switch {
		case err == nil && written != 1:
			return Record{}, storeError("transition", fmt.Errorf("%d events written for one transition", written))
		case err == nil:
			return rec, nil
		case !errors.Is(err, lifecycle.ErrNoRows):
			return Record{}, storeError("transition", err)
		}
		// Nothing moved: the record as it is now says why. Under READ
		// COMMITTED the read sees what the update waited for.
		cur, err := s.get(ctx, db, ref)
		switch {
		case err != nil:
			return Record{}, err
		case cur.Version != c.ExpectedVersion:
			return Record{}, &ConflictError{Reason: ReasonVersion, Current: cur, Change: c}
		case cur.State != c.From:
			return Record{}, &ConflictError{Reason: ReasonState, Current: cur, Change: c}
		}
		// The record is in From at the expected version, yet the update
		// did not find it so: it was created after the update's
		// snapshot. The next run finds it.
	}
	return Record{}, storeError("transition", errChanging)
}
