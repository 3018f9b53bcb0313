package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/purgeloop"
	"github.com/go-idempotency/idempotency/internal/sqltext"
	"github.com/go-idempotency/idempotency/internal/wire"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// MaxKeyLen bounds the length of a storage key and of a lease token, in
// bytes. The middleware's keys are 64 bytes and its tokens 32.
const MaxKeyLen = sqltext.MaxLen

// maxAttempts bounds how many times a statement runs when the row keeps
// changing under it (codeRetry, or a serialization failure). Each run
// after the first follows a commit on the same key that the previous run
// waited for, so a second run nearly always settles it.
const maxAttempts = 8

// Store is an idempotency.Store and idempotency.TxStore keeping records in
// a PostgreSQL table, one row per record, through a pgx connection pool. It
// is safe for concurrent use. Create it with New and stop it with Close.
type Store struct {
	pool *pgxpool.Pool
	cfg  config
	sql  statements
	hub  *hub

	closed atomic.Bool
	quit   chan struct{}  // closed by Close: stops the background purge
	purged sync.WaitGroup // the background purge

	// retries counts the statements run again because the row changed
	// under them (tests read it).
	retries atomic.Int64
	// beforeCommit, when set (by tests), runs in Tx.Complete between the
	// fence and the COMMIT.
	beforeCommit func(*Tx)
}

var (
	_ idempotency.Store   = (*Store)(nil)
	_ idempotency.TxStore = (*Store)(nil)
)

// New returns a Store keeping records in the table set by WithTable
// (DefaultTable by default) of the database pool connects to; create the
// table first with Migrate or the SQL of Schema. With WithPurgeInterval it
// starts the background purge. The Store does not close pool. It panics
// when pool is nil or an option is invalid.
func New(pool *pgxpool.Pool, opts ...Option) *Store {
	if pool == nil {
		panic("pgstore: New: nil pool")
	}
	cfg := newConfig(opts)
	listener := cfg.listener
	if listener == nil {
		listener = pool.Config().ConnConfig
	}
	s := &Store{
		pool: pool,
		cfg:  cfg,
		sql:  newStatements(cfg.table),
		hub:  newHub(listener, cfg.channel, cfg.healthCheck),
		quit: make(chan struct{}),
	}
	if cfg.purgeInterval > 0 {
		s.purged.Add(1)
		go s.purgeLoop()
	}
	return s
}

// Close stops the background purge and the listening connection, and wakes
// every waiter. Later calls on the Store return idempotency.ErrStoreClosed;
// a Tx begun before Close can still complete or roll back. Close does not
// close the pool. It is safe to call more than once.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	close(s.quit)
	s.hub.close()
	s.purged.Wait()
	return nil
}

// Table returns the quoted name of the Store's table, as its statements
// write it.
func (s *Store) Table() string { return s.cfg.table.quoted }

// OutboxTable returns the name of the outbox table that outbox.Enqueue
// writes the messages of the Store's transactions to (see
// WithOutboxTable), as given: "idempotency_outbox" or
// "schema.name", unquoted.
func (s *Store) OutboxTable() string { return strings.Join(s.cfg.outbox.parts, ".") }

// Channel returns the LISTEN/NOTIFY channel on which complete and release
// announce watched records (see WithChannel).
func (s *Store) Channel() string { return s.cfg.channel }

// checkText refuses what the store does not take as a key or token (see
// sqltext.Check).
func checkText(what, v string) error { return sqltext.Check("pgstore", what, v) }

func (s *Store) check(key, token string) error {
	if s.closed.Load() {
		return idempotency.ErrStoreClosed
	}
	if err := checkText("key", key); err != nil {
		return err
	}
	return checkText("lease token", token)
}

// interval rounds d up to whole microseconds, PostgreSQL's resolution, so
// that a lease is never shortened.
func interval(d time.Duration) time.Duration {
	return (d + time.Microsecond - 1).Truncate(time.Microsecond)
}

// retryable reports whether err is a serialization failure, which rolled
// the statement back: running it again is safe. It happens only when the
// session's isolation level is above READ COMMITTED.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40001"
}

// querier is what a statement runs on: the pool, or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Acquire implements idempotency.Store with one statement (see the package
// documentation): one round trip, and a replay's payload comes back in it.
// Only a call that races another call on the same key may need a second
// one. A retry by the token that holds the record renews its lease to run
// req.Lease from now on the server's clock when it would end sooner, even
// if it had run out, as long as no other token took the record over. A row
// whose payload cannot be read is reported as an error wrapping
// idempotency.ErrCorruptRecord, and left as it is.
func (s *Store) Acquire(ctx context.Context, req idempotency.AcquireRequest) (idempotency.Acquisition, error) {
	if err := s.check(req.Key, req.Token); err != nil {
		return idempotency.Acquisition{}, err
	}
	if req.Lease <= 0 || req.TTL <= 0 {
		return idempotency.Acquisition{}, fmt.Errorf("pgstore: lease %v and TTL %v must be positive", req.Lease, req.TTL)
	}
	for range maxAttempts {
		code, a, err := s.acquire(ctx, s.pool, req)
		switch {
		case retryable(err), err == nil && code == codeRetry:
			s.retries.Add(1)
			continue
		case err != nil:
			return idempotency.Acquisition{}, err
		}
		return a, nil
	}
	return idempotency.Acquisition{}, changingError("acquire", req.Key)
}

// acquire runs acquireSQL once on q and returns its answer: the code (see
// the constants) and, unless the code is codeRetry, the acquisition. The
// statement's SELECT answers a replay, a mismatch, a watched record in
// flight and a row that is not a record from its snapshot; its last
// column, written, holds the write's answer when the row asked for one.
func (s *Store) acquire(ctx context.Context, q querier, req idempotency.AcquireRequest) (int, idempotency.Acquisition, error) {
	// Value types with a Valid flag, not pointers: nothing to allocate per
	// column.
	var (
		state      pgtype.Text
		sameFP     pgtype.Bool
		epoch      pgtype.Int8
		leaseUntil pgtype.Timestamptz
		expiresAt  pgtype.Timestamptz
		now        time.Time
		status     pgtype.Int4
		headers    []byte
		body       []byte
		omitted    pgtype.Bool
		written    []int64
	)
	err := q.QueryRow(ctx, s.sql.acquire, req.Key, req.Token, []byte(req.Fingerprint),
		interval(req.Lease), interval(req.TTL)).
		Scan(&state, &sameFP, &epoch, &leaseUntil, &expiresAt, &now, &status, &headers, &body, &omitted, &written)
	if err != nil {
		if !retryable(err) {
			err = fmt.Errorf("pgstore: acquire %s: %w", req.Key, err)
		}
		return 0, idempotency.Acquisition{}, err
	}
	unexpected := func(what string) (int, idempotency.Acquisition, error) {
		return 0, idempotency.Acquisition{}, fmt.Errorf("pgstore: acquire %s: unexpected answer: %s", req.Key, what)
	}
	if written != nil {
		// The write ran: {code, epoch, lease left in microseconds}.
		if len(written) != 3 {
			return unexpected(fmt.Sprintf("the write answered %v", written))
		}
		code, epoch, remainingUS := int(written[0]), written[1], written[2]
		switch {
		case code == codeRetry:
			return codeRetry, idempotency.Acquisition{}, nil
		case epoch < 1:
		case code == acquireTaken:
			o := idempotency.Acquired
			if epoch > 1 {
				o = idempotency.Stolen
			}
			return code, idempotency.Acquisition{Outcome: o, Epoch: uint64(epoch)}, nil
		case code == acquireInFlight:
			return code, inFlight(epoch, time.Duration(remainingUS)*time.Microsecond), nil
		}
		return unexpected(fmt.Sprintf("the write answered %v", written))
	}
	// No write: the row from the snapshot settles the answer. The
	// statement called the write for no row, an expired record, and a
	// record in progress with the same fingerprint that is the caller's,
	// past its lease or not yet watched; these are the other cases, in the
	// order the statement's condition tells them apart.
	switch {
	case !state.Valid:
		return unexpected("no row, and no write")
	case !expiresAt.Valid:
		return codeCorrupt, idempotency.Acquisition{}, corruptState(req.Key, &state.String)
	case !sameFP.Valid || !epoch.Valid || !leaseUntil.Valid:
		return unexpected("a record without fingerprint, epoch or lease")
	case !sameFP.Bool:
		return acquireMismatch, idempotency.Acquisition{Outcome: idempotency.Mismatch}, nil
	case state.String == "complete":
		resp, err := decode(status, headers, body, omitted)
		if err != nil {
			return 0, idempotency.Acquisition{}, fmt.Errorf("%w (key %s)", err, req.Key)
		}
		return acquireCompleted, idempotency.Acquisition{
			Outcome:   idempotency.Completed,
			Epoch:     uint64(max(epoch.Int64, 0)),
			Response:  resp,
			ExpiresIn: max(expiresAt.Time.Sub(now), time.Millisecond),
		}, nil
	case epoch.Int64 < 1:
		return unexpected(fmt.Sprintf("a record in progress at epoch %d", epoch.Int64))
	}
	return acquireInFlight, inFlight(epoch.Int64, leaseUntil.Time.Sub(now)), nil
}

// inFlight is the answer for a record in progress under another token's
// lease, with remaining left of it.
func inFlight(epoch int64, remaining time.Duration) idempotency.Acquisition {
	return idempotency.Acquisition{
		Outcome:        idempotency.InFlight,
		Epoch:          uint64(epoch),
		LeaseRemaining: max(remaining, time.Millisecond),
	}
}

// changingError reports a statement that found the row changed under it
// maxAttempts times in a row; the call changed nothing.
func changingError(op, key string) error {
	return fmt.Errorf("pgstore: %s %s: the record changed under %d attempts in a row; nothing was written", op, key, maxAttempts)
}

func corruptState(key string, state *string) error {
	s := "NULL"
	if state != nil {
		s = fmt.Sprintf("%q", *state)
	}
	return fmt.Errorf("%w: key %s: unknown state %s", idempotency.ErrCorruptRecord, key, s)
}

// decode rebuilds a COMPLETE record's response from its columns. Anything
// missing, unreadable or inconsistent is an error wrapping
// idempotency.ErrCorruptRecord.
func decode(status pgtype.Int4, headers, body []byte, omitted pgtype.Bool) (*idempotency.Response, error) {
	if !status.Valid || headers == nil || body == nil || !omitted.Valid {
		return nil, fmt.Errorf("%w: a COMPLETE row without status, headers, body or body_omitted", idempotency.ErrCorruptRecord)
	}
	resp, err := wire.Decode(string(headers), string(body))
	if err != nil {
		return nil, err
	}
	if int32(resp.Status) != status.Int32 || resp.BodyOmitted != omitted.Bool {
		return nil, fmt.Errorf("%w: status %d and body_omitted %v disagree with the headers block (%d, %v)",
			idempotency.ErrCorruptRecord, status.Int32, omitted.Bool, resp.Status, resp.BodyOmitted)
	}
	return resp, nil
}

// encoded is a response in the form of the table's columns.
type encoded struct {
	status  int32
	headers []byte
	body    []byte
	omitted bool
}

func encode(resp *idempotency.Response) (encoded, error) {
	meta, err := wire.AppendMeta(nil, resp)
	if err != nil {
		return encoded{}, fmt.Errorf("pgstore: %w", err)
	}
	e := encoded{status: int32(resp.Status), headers: meta, body: resp.Body, omitted: resp.BodyOmitted || resp.HeaderOmitted}
	if e.omitted || e.body == nil {
		e.body = []byte{}
	}
	return e, nil
}

// Complete implements idempotency.Store with one statement, which also
// notifies the waiters of a watched record.
func (s *Store) Complete(ctx context.Context, key, token string, resp *idempotency.Response, ttl time.Duration) error {
	if err := s.check(key, token); err != nil {
		return err
	}
	code, state, err := s.complete(ctx, s.pool, key, token, resp, ttl)
	if err != nil {
		return err
	}
	switch code {
	case fencedDone, fencedAlready:
		return nil
	case fencedLost:
		return idempotency.ErrLeaseLost
	case codeCorrupt:
		return corruptState(key, state)
	}
	return fmt.Errorf("pgstore: complete %s: unexpected answer %d", key, code)
}

// complete runs completeSQL on q until it settles, and returns its code.
func (s *Store) complete(ctx context.Context, q querier, key, token string, resp *idempotency.Response, ttl time.Duration) (int, *string, error) {
	if ttl <= 0 {
		return 0, nil, fmt.Errorf("pgstore: TTL %v must be positive", ttl)
	}
	e, err := encode(resp)
	if err != nil {
		return 0, nil, err
	}
	return s.fenced(ctx, q, "complete", key, fencedLost, s.sql.complete,
		key, token, e.status, e.headers, e.body, e.omitted, interval(ttl), s.cfg.channel)
}

// fenced runs one of the fenced statements (complete, release, extend) on
// q until it settles, and returns its code (never codeRetry) and, for
// codeCorrupt, the row's state. A statement that finds no row at all
// answers nothing; fenced returns absent for it.
func (s *Store) fenced(ctx context.Context, q querier, op, key string, absent int, sql string, args ...any) (int, *string, error) {
	for range maxAttempts {
		var (
			code     int
			notified int64
			state    *string
		)
		err := q.QueryRow(ctx, sql, args...).Scan(&code, &notified, &state)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return absent, nil, nil
		case retryable(err):
			if _, inTx := q.(pgx.Tx); inTx {
				// A serialization failure aborts the transaction.
				return 0, nil, fmt.Errorf("pgstore: %s %s: %w", op, key, err)
			}
			s.retries.Add(1)
			continue
		case err != nil:
			return 0, nil, fmt.Errorf("pgstore: %s %s: %w", op, key, err)
		case code == codeRetry:
			s.retries.Add(1)
			continue
		}
		return code, state, nil
	}
	return 0, nil, changingError(op, key)
}

// Release implements idempotency.Store with one statement, which also
// notifies the waiters of a watched record.
func (s *Store) Release(ctx context.Context, key, token string) error {
	if err := s.check(key, token); err != nil {
		return err
	}
	code, state, err := s.fenced(ctx, s.pool, "release", key, fencedAbsent, s.sql.release, key, token, s.cfg.channel)
	if err != nil {
		return err
	}
	switch code {
	case fencedDone, fencedAbsent:
		return nil
	case fencedLost:
		return idempotency.ErrLeaseLost
	case codeCorrupt:
		return corruptState(key, state)
	}
	return fmt.Errorf("pgstore: release %s: unexpected answer %d", key, code)
}

// Extend implements idempotency.Store with one statement.
func (s *Store) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	if err := s.check(key, token); err != nil {
		return err
	}
	if lease <= 0 {
		return fmt.Errorf("pgstore: lease %v must be positive", lease)
	}
	code, state, err := s.fenced(ctx, s.pool, "extend", key, fencedLost, s.sql.extend, key, token, interval(lease))
	if err != nil {
		return err
	}
	switch code {
	case fencedDone:
		return nil
	case fencedLost:
		return idempotency.ErrLeaseLost
	case codeCorrupt:
		return corruptState(key, state)
	}
	return fmt.Errorf("pgstore: extend %s: unexpected answer %d", key, code)
}

// Purge deletes at most batch expired records, oldest first, in one
// statement, and returns how many it deleted. Expired records are absent
// whether or not they were purged; purging frees their space. Run it from
// a job of your own, or let the Store run it (WithPurgeInterval). Purges
// running at once on the same table skip each other's rows. It returns an
// error when batch is not positive.
func (s *Store) Purge(ctx context.Context, batch int) (int, error) {
	if s.closed.Load() {
		return 0, idempotency.ErrStoreClosed
	}
	if batch <= 0 {
		return 0, fmt.Errorf("pgstore: purge batch %d is not positive", batch)
	}
	return s.purge(ctx, batch)
}

func (s *Store) purge(ctx context.Context, batch int) (int, error) {
	tag, err := s.pool.Exec(ctx, s.sql.purge, batch)
	if err != nil {
		return 0, fmt.Errorf("pgstore: purge: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// purgeLoop is the background purge (WithPurgeInterval).
func (s *Store) purgeLoop() {
	defer s.purged.Done()
	purgeloop.Run(s.quit, s.cfg.purgeInterval, s.cfg.purgeBatch, s.purge, s.cfg.onPurgeError)
}
