package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/pgstore"
)

// DB is the database handle a Store runs its statements on: a pool (each
// statement a transaction of its own), a connection, or a transaction.
// *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it. It is the outbox's
// lifecycle.DB.
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

// move is the transition's statement on one outbox table.
type move struct {
	sql    string
	outbox *lifecycle.Table
}

// New returns a Store of the records in the table of WithTable
// (pgstore.DefaultStateTable by default) of the database db connects to:
// a pool, or a connection; create the tables first with pgstore.Migrate or
// the SQL of pgstore.StateSchema. Inside a transactional route or call
// (idempotency.WithTransaction(true) over a pgstore.Store) each call runs
// in its transaction instead, found in its context. New makes no
// connection. It panics when db is nil or an option is invalid.
func New(db DB, opts ...Option) *Store {
	if db == nil {
		panic("state: New: nil DB")
	}
	cfg := newConfig(opts)
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
	sql, err := transitionStatement(s.cfg.dialect, s.vars, out)
	if err != nil {
		return nil, err
	}
	m, _ := s.moves.LoadOrStore(name, &move{sql: sql, outbox: out})
	return m.(*move), nil
}

// on returns the handle that the statements of a call with ctx run on, and
// the outbox table that its transitions write to: the transaction of the
// transactional route or call whose context ctx is (idempotency.Info.Tx),
// whose Store's outbox it is, or else the Store's DB and WithOutboxTable's.
func (s *Store) on(ctx context.Context) (DB, string) {
	if info, ok := idempotency.FromContext(ctx); ok {
		if tx, ok := info.Tx.(DB); ok {
			name := s.cfg.outbox
			if o, ok := info.Tx.(interface{ OutboxTable() string }); ok {
				name = o.OutboxTable()
			}
			return tx, name
		}
	}
	return s.db, s.cfg.outbox
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
	db, _ := s.on(ctx)
	for range maxAttempts {
		rec := Record{Ref: ref}
		err := db.QueryRow(ctx, s.sql.create, ref.Scope, ref.Machine, ref.ID, st, string(data)).
			Scan(&rec.State, &rec.Version, &rec.Data, &rec.CreatedAt, &rec.UpdatedAt)
		switch {
		case err == nil:
			return rec, nil
		case !errors.Is(err, pgx.ErrNoRows):
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
	db, _ := s.on(ctx)
	return s.get(ctx, db, ref)
}

func (s *Store) get(ctx context.Context, db DB, ref Ref) (Record, error) {
	rec := Record{Ref: ref}
	err := db.QueryRow(ctx, s.sql.get, ref.Scope, ref.Machine, ref.ID).
		Scan(&rec.State, &rec.Version, &rec.Data, &rec.CreatedAt, &rec.UpdatedAt)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
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
	db, outboxName := s.on(ctx)
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
		err := db.QueryRow(ctx, m.sql, ref.Scope, ref.Machine, ref.ID, c.From, c.To, c.ExpectedVersion, data,
			msg.key, msg.cause, msg.topic, msg.payload, msg.headers, msg.orderingKey).
			Scan(&rec.State, &rec.Version, &rec.Data, &rec.CreatedAt, &rec.UpdatedAt, &written)
		switch {
		case err == nil && written != 1:
			return Record{}, storeError("transition", fmt.Errorf("%d events written for one transition", written))
		case err == nil:
			return rec, nil
		case !errors.Is(err, pgx.ErrNoRows):
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
