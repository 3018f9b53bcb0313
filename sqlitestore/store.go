package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" driver: pure Go, no cgo

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/purgeloop"
	"github.com/go-idempotency/idempotency/internal/sqltext"
)

// MaxKeyLen bounds the length of a storage key and of a lease token, in
// bytes. The middleware's keys are 64 bytes and its tokens 32.
const MaxKeyLen = sqltext.MaxLen

// Store is an idempotency.Store and idempotency.TxStore keeping records in
// a table of an SQLite file, one row per record. It is safe for concurrent
// use. Open it with Open and stop it with Close.
type Store struct {
	outboxState
	db   *sql.DB
	path string
	cfg  config
	stmt statements // prepared by Open, closed by Close

	// writer is the Store's write turn: a writer holds its one slot from
	// before its BEGIN IMMEDIATE to after its COMMIT or ROLLBACK, a
	// transactional request for its handler's whole run. Waiting here,
	// rather than in SQLite's busy handler, which sleeps and polls, wakes
	// the next writer the moment the lock is free, and ends the wait with
	// the caller's context.
	writer chan struct{}
	// wmu guards w, the connection of the Store's own writes (see
	// writer): held by a write, in the write turn, and by Close.
	wmu sync.Mutex
	w   *writer

	closed atomic.Bool
	quit   chan struct{}  // closed by Close: stops the background goroutines
	bg     sync.WaitGroup // the purge and the poller

	txMu sync.Mutex
	txs  map[string]*Tx // the open transactions by key (see Store.Extend)

	hub hub // the waiters (watch.go)

	// beforeCommit, when set (by tests), runs in Tx.Complete between the
	// fence and the COMMIT.
	beforeCommit func(*Tx)
	// afterEmptyRead, when set (by tests), runs in Acquire between a read
	// that found no row and the fresh edge's INSERT.
	afterEmptyRead func(key string)
}

var (
	_ idempotency.Store   = (*Store)(nil)
	_ idempotency.TxStore = (*Store)(nil)
)

// Open opens the SQLite file at path, creating it when it does not exist,
// creates the records' table and its index when they do not exist (see
// Schema), and checks the file's settings (see Store.Check): it returns an
// error naming what is wrong when the file cannot be written, its journal
// is not in WAL mode, or a table of that name has other columns. With
// WithPurgeInterval it starts the background purge, with WithPollInterval
// the poller of waiters.
//
// path is a file name, not a URI. Every connection to it is opened with
// journal_mode=WAL, synchronous=FULL, foreign_keys=ON, the busy_timeout of
// WithBusyTimeout, and BEGIN IMMEDIATE for every transaction begun through
// the *sql.DB (DB). Open panics when an option is invalid.
func Open(path string, opts ...Option) (*Store, error) {
	cfg := newConfig(opts)
	if path == "" {
		return nil, errors.New("sqlitestore: open: empty path")
	}
	db, err := sql.Open("sqlite", dsn(path, cfg))
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: open %s: %w", path, err)
	}
	// Connections stay open: each new one runs its pragmas again. The
	// writer keeps one more (see writer).
	db.SetMaxOpenConns(cfg.maxConns + 1)
	db.SetMaxIdleConns(cfg.maxConns + 1)
	s := &Store{
		db:     db,
		path:   path,
		cfg:    cfg,
		writer: make(chan struct{}, 1),
		quit:   make(chan struct{}),
		txs:    make(map[string]*Tx),
	}
	s.hub.init()
	if err := s.setUp(context.Background()); err != nil {
		db.Close()
		return nil, err
	}
	if cfg.purgeInterval > 0 {
		s.bg.Add(1)
		go s.purgeLoop()
	}
	if cfg.pollInterval > 0 {
		s.bg.Add(1)
		go s.pollLoop()
	}
	return s, nil
}

// dsn is the URI the driver opens every connection with: path, and the
// settings as query parameters that modernc.org/sqlite applies to each
// connection (SQLite ignores them).
func dsn(path string, cfg config) string {
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", (cfg.busyTimeout+time.Millisecond-1)/time.Millisecond))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	q.Add("_pragma", "foreign_keys(1)")
	q.Set("_txlock", "immediate")
	uri := "file:" + strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path) + "?" + q.Encode()
	if cfg.dsnParams != "" {
		uri += "&" + cfg.dsnParams
	}
	return uri
}

// setUp checks the file, creates the schema and prepares the statements.
func (s *Store) setUp(ctx context.Context) error {
	if err := s.checkSettings(ctx); err != nil {
		return err
	}
	if err := s.checkSchema(ctx, true); err != nil {
		return err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlitestore: %s: create table: %w", s.path, err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, s.schema()); err != nil {
		return fmt.Errorf("sqlitestore: %s: create table %s: %w", s.path, s.cfg.table.quoted, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlitestore: %s: create table %s: %w", s.path, s.cfg.table.quoted, err)
	}
	if err := s.checkSchema(ctx, false); err != nil {
		return err
	}
	if s.stmt, err = prepare(ctx, s.db, s.cfg.table); err != nil {
		return fmt.Errorf("sqlitestore: %s: %w", s.path, err)
	}
	if s.w, err = openWriter(ctx, s.db, s.stmt); err != nil {
		s.stmt.close()
		return fmt.Errorf("sqlitestore: %s: %w", s.path, err)
	}
	return nil
}

// DB returns the Store's handle on the file, for the application's own
// tables and migrations. Its connections have the Store's settings (see
// Open); a transaction begun on it is BEGIN IMMEDIATE, so it takes the
// file's write lock at once, and waits for the Store's writers (and they
// for it) up to the busy timeout. Close closes it.
func (s *Store) DB() *sql.DB { return s.db }

// Close stops the background purge and the poller, wakes every waiter and
// closes the *sql.DB. Later calls on the Store return
// idempotency.ErrStoreClosed; a Tx begun before Close can still complete
// or roll back. It is safe to call more than once.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	close(s.quit)
	s.hub.close()
	s.bg.Wait()
	s.wmu.Lock()
	if s.w != nil {
		s.w.close(false)
		s.w = nil
	}
	s.wmu.Unlock()
	s.stmt.close()
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("sqlitestore: close %s: %w", s.path, err)
	}
	return nil
}

// now is the Store's clock in unix microseconds.
func (s *Store) now() int64 { return s.cfg.clock().UnixMicro() }

// checkText refuses what the store does not take as a key or token (see
// sqltext.Check).
func checkText(what, v string) error { return sqltext.Check("sqlitestore", what, v) }

func (s *Store) check(key, token string) error {
	if s.closed.Load() {
		return idempotency.ErrStoreClosed
	}
	if err := checkText("key", key); err != nil {
		return err
	}
	return checkText("lease token", token)
}

// opError names the call and key in err; ErrLeaseLost stays as it is, as
// the contract words it.
func opError(op, key string, err error) error {
	if err == nil || errors.Is(err, idempotency.ErrLeaseLost) {
		return err
	}
	return fmt.Errorf("sqlitestore: %s %s: %w", op, key, err)
}

// take waits for the Store's write turn (see Store.writer).
func (s *Store) take(ctx context.Context) error {
	select {
	case s.writer <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for the write lock: %w", context.Cause(ctx))
	case <-s.quit:
		return idempotency.ErrStoreClosed
	}
}

// give ends the write turn.
func (s *Store) give() { <-s.writer }

// readIn reads key's record in a write transaction (see scanRecord).
func (s *Store) readIn(ctx context.Context, in stmtIn, key string) (*record, error) {
	return scanRecord(in(ctx, s.stmt.read).QueryRowContext(ctx, key))
}

// Acquire implements idempotency.Store. It reads the record outside any
// transaction, and answers from that read a replay, a mismatch and a
// duplicate in flight: a plain read in WAL mode, which waits for no writer
// (see Store.read). With no row, it writes the fresh record in one
// statement that writes nothing when a row appeared since (createSQL).
// Otherwise (a row appeared, an expired one, a lease that ran out, the
// holder's retry) it writes in a BEGIN IMMEDIATE transaction, deciding
// again on the row read under the lock. A retry by the token that holds the
// record renews its lease to run req.Lease from now when it would end
// sooner, even if it had run out, as long as no other token took the record
// over. A row that is not a record is reported as an error wrapping
// idempotency.ErrCorruptRecord, and left as it is.
func (s *Store) Acquire(ctx context.Context, req idempotency.AcquireRequest) (idempotency.Acquisition, error) {
	if err := s.check(req.Key, req.Token); err != nil {
		return idempotency.Acquisition{}, err
	}
	if req.Lease <= 0 || req.TTL <= 0 {
		return idempotency.Acquisition{}, fmt.Errorf("sqlitestore: lease %v and TTL %v must be positive", req.Lease, req.TTL)
	}
	r, err := s.read(ctx, req.Key)
	if err != nil {
		return idempotency.Acquisition{}, opError("acquire", req.Key, err)
	}
	// The clock is read after the row: a deadline still ahead now was
	// ahead when the row was read.
	action, a, err := judgeAcquire(r, s.now(), req)
	if err != nil || action == answer {
		return a, opError("acquire", req.Key, err)
	}
	if r == nil {
		// No row: the fresh edge, unless a row appeared since.
		if s.afterEmptyRead != nil {
			s.afterEmptyRead(req.Key)
		}
		n, err := s.autocommit(ctx, s.stmt.create, func(now int64) []any {
			return []any{req.Key, req.Token, []byte(req.Fingerprint), 1, now + micros(req.Lease), now + micros(req.TTL), now}
		})
		if err != nil {
			return idempotency.Acquisition{}, opError("acquire", req.Key, err)
		}
		if n == 1 {
			return idempotency.Acquisition{Outcome: idempotency.Acquired, Epoch: 1}, nil
		}
	}
	a, err = s.acquireLocked(ctx, req)
	return a, opError("acquire", req.Key, err)
}

// read reads key's record outside any transaction, for Acquire: on the
// Store's writer when the write turn is free, and on a connection of the
// pool when it is not, so that the read never waits for a writer, and a
// writer waits at most for one read. SQLite empties a connection's page
// cache when another connection has committed since its last
// transaction: on the writer, which wrote last, a first execution's read
// finds its pages in the cache, where a connection of the pool read them
// again from the file after every commit (over 500 first executions in
// process, strace -c: 1,671 reads of a page on the pool, 229 on the
// writer, 235 for the record floor of benchmarks/sqlitebench).
func (s *Store) read(ctx context.Context, key string) (*record, error) {
	select {
	case s.writer <- struct{}{}:
	default:
		return scanRecord(s.stmt.read.QueryRowContext(ctx, key))
	}
	defer s.give()
	w, err := s.takeWriter(ctx)
	if err != nil {
		return nil, err
	}
	defer s.putWriter(w)
	// On the writer the read waits for nothing: it runs without ctx's
	// cancellation, which database/sql and the driver would each watch
	// with a goroutine of their own.
	in := context.WithoutCancel(ctx)
	return scanRecord(w.stmt(in, s.stmt.read).QueryRowContext(in, key))
}

// acquireLocked is Acquire's write: in a BEGIN IMMEDIATE transaction, it
// reads the record again, decides again, and writes the record in progress
// under req.Token, unless the row read under the lock settles the answer.
// It is a method of its own so that Acquire's read-only answers (a replay,
// a mismatch, a duplicate in flight) allocate nothing for the closure.
func (s *Store) acquireLocked(ctx context.Context, req idempotency.AcquireRequest) (idempotency.Acquisition, error) {
	var a idempotency.Acquisition
	err := s.write(ctx, func(ctx context.Context, in stmtIn, now int64) (bool, error) {
		r, err := s.readIn(ctx, in, req.Key)
		if err != nil {
			return false, err
		}
		var action acquireAction
		action, a, err = judgeAcquire(r, now, req)
		if err != nil || action == answer {
			return false, err
		}
		var epoch, leaseUntil, ttlUntil int64
		switch action {
		case fresh:
			epoch, leaseUntil, ttlUntil = 1, now+micros(req.Lease), now+micros(req.TTL)
		case renew:
			epoch, leaseUntil, ttlUntil = r.epoch, max(r.leaseUntil, now+micros(req.Lease)), r.ttlUntil
		case steal:
			epoch, leaseUntil, ttlUntil = r.epoch+1, now+micros(req.Lease), now+micros(req.TTL)
		}
		if _, err := in(ctx, s.stmt.take).ExecContext(ctx, req.Key, req.Token, []byte(req.Fingerprint), epoch, leaseUntil, ttlUntil, now); err != nil {
			return false, err
		}
		a = idempotency.Acquisition{Outcome: idempotency.Acquired, Epoch: uint64(epoch)}
		if epoch > 1 {
			a.Outcome = idempotency.Stolen
		}
		return true, nil
	})
	if err != nil {
		return idempotency.Acquisition{}, err
	}
	return a, nil
}

// Complete implements idempotency.Store: in a BEGIN IMMEDIATE transaction,
// it stores resp and moves the record to COMPLETE when token holds it,
// returns nil without writing when the record is already COMPLETE under
// token (a retry keeps the first payload), and idempotency.ErrLeaseLost
// otherwise. After the COMMIT it wakes the key's waiters.
func (s *Store) Complete(ctx context.Context, key, token string, resp *idempotency.Response, ttl time.Duration) error {
	if err := s.check(key, token); err != nil {
		return err
	}
	if ttl <= 0 {
		return fmt.Errorf("sqlitestore: TTL %v must be positive", ttl)
	}
	e, err := encode(resp)
	if err != nil {
		return err
	}
	var completed bool
	err = s.write(ctx, func(ctx context.Context, in stmtIn, now int64) (bool, error) {
		r, err := s.readIn(ctx, in, key)
		switch {
		case err != nil:
			return false, err
		case r.live(now) && r.state == stateComplete && r.token == token:
			return false, nil
		case !r.held(token, now):
			return false, idempotency.ErrLeaseLost
		}
		if err := s.fence(ctx, in, key, token, e, ttl, now); err != nil {
			return false, err
		}
		completed = true
		return true, nil
	})
	if err != nil {
		return opError("complete", key, err)
	}
	if completed {
		s.hub.wake(key)
	}
	return nil
}

// errFenced is the fence's answer when it updated no row.
var errFenced = errors.New("the record is no longer in progress under the token")

// fence runs completeSQL in a write transaction: the record becomes COMPLETE with e, kept
// for ttl from now, when it is still in progress under token and not
// expired; otherwise it returns errFenced and changes nothing.
func (s *Store) fence(ctx context.Context, in stmtIn, key, token string, e encoded, ttl time.Duration, now int64) error {
	res, err := in(ctx, s.stmt.complete).ExecContext(ctx, key, token, e.status, e.headers, e.body, e.omitted, now+micros(ttl), now)
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	switch {
	case err != nil:
		return err
	case n == 0:
		return errFenced
	}
	return nil
}

// Release implements idempotency.Store: in a BEGIN IMMEDIATE transaction,
// it deletes the record when token holds it, returns nil when there is no
// record (or an expired one: released already), and
// idempotency.ErrLeaseLost when another token holds it or it is COMPLETE.
// After the COMMIT it wakes the key's waiters.
func (s *Store) Release(ctx context.Context, key, token string) error {
	if err := s.check(key, token); err != nil {
		return err
	}
	var released bool
	err := s.write(ctx, func(ctx context.Context, in stmtIn, now int64) (bool, error) {
		r, err := s.readIn(ctx, in, key)
		switch {
		case err != nil:
			return false, err
		case !r.live(now):
			return false, nil
		case !r.held(token, now):
			return false, idempotency.ErrLeaseLost
		}
		if _, err := in(ctx, s.stmt.release).ExecContext(ctx, key, token, now); err != nil {
			return false, err
		}
		released = true
		return true, nil
	})
	if err != nil {
		return opError("release", key, err)
	}
	if released {
		s.hub.wake(key)
	}
	return nil
}

// Extend implements idempotency.Store: the lease of the record token holds
// runs lease from now; idempotency.ErrLeaseLost when the record is absent,
// COMPLETE or another token's.
//
// While a Tx for key is open in this Store (a transactional handler runs),
// the Tx holds the file's write lock, and any other transaction's write
// would wait for it: the middleware's heartbeat would fail and cancel a
// healthy handler. So Extend of that key runs inside the Tx: the extended
// lease commits with the record, or rolls back with it. Other processes
// see the lease the record had when the Tx began; none can steal it while
// the Tx holds the lock.
func (s *Store) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	if err := s.check(key, token); err != nil {
		return err
	}
	if lease <= 0 {
		return fmt.Errorf("sqlitestore: lease %v must be positive", lease)
	}
	if t := s.openTx(key); t != nil {
		if ran, err := t.extend(ctx, token, lease); ran {
			return opError("extend", key, err)
		}
	}
	err := s.write(ctx, func(ctx context.Context, in stmtIn, now int64) (bool, error) {
		return s.extend(ctx, in, key, token, lease, now)
	})
	return opError("extend", key, err)
}

// extend is the extend edge in a write transaction: it reads the record and, when token
// holds it, pushes its lease. It returns whether it wrote.
func (s *Store) extend(ctx context.Context, in stmtIn, key, token string, lease time.Duration, now int64) (bool, error) {
	r, err := s.readIn(ctx, in, key)
	switch {
	case err != nil:
		return false, err
	case !r.held(token, now):
		return false, idempotency.ErrLeaseLost
	}
	if _, err := in(ctx, s.stmt.extend).ExecContext(ctx, key, token, now+micros(lease), now); err != nil {
		return false, err
	}
	return true, nil
}

// Purge deletes at most batch expired records, oldest first, in one
// transaction, and returns how many it deleted. Expired records are absent
// whether or not they were purged; purging frees their space. Run it from
// a job of your own, repeating while it returns batch, or let the Store
// run it (WithPurgeInterval). It returns an error when batch is not
// positive.
func (s *Store) Purge(ctx context.Context, batch int) (int, error) {
	if s.closed.Load() {
		return 0, idempotency.ErrStoreClosed
	}
	if batch <= 0 {
		return 0, fmt.Errorf("sqlitestore: purge batch %d is not positive", batch)
	}
	return s.purge(ctx, batch)
}

func (s *Store) purge(ctx context.Context, batch int) (int, error) {
	var n int64
	err := s.write(ctx, func(ctx context.Context, in stmtIn, now int64) (bool, error) {
		res, err := in(ctx, s.stmt.purge).ExecContext(ctx, now, batch)
		if err != nil {
			return false, err
		}
		n, err = res.RowsAffected()
		return n > 0, err
	})
	if err != nil {
		return 0, fmt.Errorf("sqlitestore: purge: %w", err)
	}
	return int(n), nil
}

// purgeLoop is the background purge (WithPurgeInterval).
func (s *Store) purgeLoop() {
	defer s.bg.Done()
	purgeloop.Run(s.quit, s.cfg.purgeInterval, s.cfg.purgeBatch, s.purge, s.cfg.onPurgeError)
}
