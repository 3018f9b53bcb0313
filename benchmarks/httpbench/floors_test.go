package httpbench

import (
	"bytes"
	"context"
	"database/sql"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency/benchmarks/internal/sqlitefloor"
	"github.com/go-idempotency/idempotency/benchmarks/load"
	"github.com/go-idempotency/idempotency/pgstore"
	"github.com/go-idempotency/idempotency/sqlitestore"
)

// The record floors do the store round trips the middleware needs at best,
// by hand, and check nothing: a first execution creates its record, runs
// the handler, flushes the response (as the middleware does before it
// stores it) and stores the response in the record; a duplicate (the
// X-Load-Kind header says "dup") reads the stored response back and
// answers with it, without running the handler. Redis's is
// load.RecordFloorHandler.

// headerBlock stands, in a floor's record, for the status-and-headers block
// the stores keep; it is about its size.
var headerBlock = []byte("\x00\x00\x00\xc9Content-Type\x00application/json\x00Content-Length\x001024\x00")

// dup reports whether r is a duplicate, and reads its body (the middleware
// reads it for the fingerprint).
func dup(r *http.Request) bool {
	_, _ = io.Copy(io.Discard, r.Body)
	return r.Header.Get(load.HeaderKind) == "dup"
}

// answer writes a stored response: 201, a JSON content type and body.
func answer(w http.ResponseWriter, body []byte) {
	h := w.Header()
	h["Content-Type"] = []string{"application/json"}
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(body)
}

// unavailable answers 503 with err.
func unavailable(w http.ResponseWriter, err error) {
	http.Error(w, err.Error(), http.StatusServiceUnavailable)
}

// memFloor is the record floor of an in-process store: a map under one
// lock, whose records keep their own copy of the header block and the
// body, as memstore's do.
type memFloor struct {
	mu      sync.Mutex
	records map[string]*memRecord
}

// memRecord is a record of memFloor; a stored one is never changed.
type memRecord struct {
	done         bool
	expires      time.Time
	header, body []byte
}

func newMemFloor() *memFloor { return &memFloor{records: map[string]*memRecord{}} }

// handler is the floor of replays and first executions, whose handler
// writes payload.
func (f *memFloor) handler(payload []byte) http.Handler {
	next := load.Handler(payload)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		if dup(r) {
			f.mu.Lock()
			rec := f.records[key]
			f.mu.Unlock()
			if rec == nil || !rec.done {
				http.Error(w, "no record", http.StatusServiceUnavailable)
				return
			}
			answer(w, rec.body)
			return
		}
		f.mu.Lock()
		f.records[key] = &memRecord{expires: time.Now().Add(ttl)}
		f.mu.Unlock()
		next.ServeHTTP(w, r)
		_ = http.NewResponseController(w).Flush()
		rec := &memRecord{done: true, expires: time.Now().Add(ttl), header: bytes.Clone(headerBlock), body: bytes.Clone(payload)}
		f.mu.Lock()
		f.records[key] = rec
		f.mu.Unlock()
	})
}

// pgFloor holds the record floors of PostgreSQL: plain pgx statements on a
// table of the store's own schema (pgstore.Schema: the same columns and
// indexes) that read the server's clock with now().
type pgFloor struct {
	pool    *pgxpool.Pool
	payload []byte
	tokens  atomic.Int64
}

// The floors' statements, and the payment row a transactional handler
// writes.
const (
	floorSchema = `CREATE TABLE payments (id bigserial PRIMARY KEY, idem_key text NOT NULL, amount int NOT NULL)`
	paymentSQL  = `INSERT INTO payments (idem_key, amount) VALUES ($1, $2)`
)

// fingerprint stands for a request's fingerprint, of the middleware's size.
var fingerprint = []byte(strings.Repeat("f", 64))

// txOptions are pgstore's default.
var txOptions = pgx.TxOptions{IsoLevel: pgx.ReadCommitted}

// newPGFloor makes the store's table, the floor's and the payments'.
func newPGFloor(pool *pgxpool.Pool, payload []byte) (*pgFloor, error) {
	ctx := context.Background()
	if err := load.MigrateFloor(ctx, pool); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, floorSchema); err != nil {
		return nil, err
	}
	return &pgFloor{pool: pool, payload: payload}, nil
}

// execer is a pool or a transaction.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// create inserts key's in-progress row; complete stores the response in it.
func (f *pgFloor) create(ctx context.Context, key string) error {
	_, err := f.pool.Exec(ctx, load.RecordNewSQL, key, strconv.FormatInt(f.tokens.Add(1), 16), fingerprint, time.Minute, ttl)
	return err
}

func (f *pgFloor) complete(ctx context.Context, q execer, key string) error {
	_, err := q.Exec(ctx, load.RecordDoneSQL, key, int32(http.StatusCreated), headerBlock, f.payload, ttl)
	return err
}

// handler is the floor of replays and first executions: one SELECT by
// primary key; or an INSERT, the handler, an UPDATE.
func (f *pgFloor) handler() http.Handler {
	next := load.Handler(f.payload)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		if dup(r) {
			var status int32
			var header, body []byte
			if err := f.pool.QueryRow(r.Context(), load.RecordReadSQL, key).Scan(&status, &header, &body); err != nil {
				unavailable(w, err)
				return
			}
			answer(w, body)
			return
		}
		if err := f.create(r.Context(), key); err != nil {
			unavailable(w, err)
			return
		}
		next.ServeHTTP(w, r)
		_ = http.NewResponseController(w).Flush()
		_ = f.complete(r.Context(), f.pool, key)
	})
}

// insertPayment is the transactional handler's own write.
func insertPayment(r *http.Request, tx execer) error {
	_, err := tx.Exec(r.Context(), paymentSQL, r.Header.Get("Idempotency-Key"), int32(len(reqBody)))
	return err
}

// payHandler is the handler of the transactional route: it inserts the
// payment row in the request's transaction, then answers.
func (f *pgFloor) payHandler() http.Handler {
	next := load.Handler(f.payload)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, ok := pgstore.TxFromContext(r.Context())
		if !ok {
			http.Error(w, "no transaction", http.StatusInternalServerError)
			return
		}
		if err := insertPayment(r, tx); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// txHandler is the transactional record floor: the record's INSERT, then
// one transaction holding the payment's INSERT and the record's UPDATE,
// then the response (sent after the commit, as the middleware sends it).
func (f *pgFloor) txHandler() http.Handler {
	return f.inTx(func(r *http.Request) error { return f.create(r.Context(), r.Header.Get("Idempotency-Key")) },
		func(r *http.Request, tx pgx.Tx) error {
			return f.complete(r.Context(), tx, r.Header.Get("Idempotency-Key"))
		})
}

// ownTxHandler is the handler alone on the transactional route: its
// payment row in a transaction of its own (BEGIN, INSERT, COMMIT), no
// record.
func (f *pgFloor) ownTxHandler() http.Handler {
	return f.inTx(func(*http.Request) error { return nil }, func(*http.Request, pgx.Tx) error { return nil })
}

// inTx runs before, then a transaction with the payment's INSERT and
// then, then the handler.
func (f *pgFloor) inTx(before func(*http.Request) error, then func(*http.Request, pgx.Tx) error) http.Handler {
	next := load.Handler(f.payload)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = dup(r)
		if err := before(r); err != nil {
			unavailable(w, err)
			return
		}
		if err := pgx.BeginTxFunc(r.Context(), f.pool, txOptions, func(tx pgx.Tx) error {
			if err := insertPayment(r, tx); err != nil {
				return err
			}
			return then(r, tx)
		}); err != nil {
			unavailable(w, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// sqliteFloor is the record floor of SQLite over HTTP: the statements of
// internal/sqlitefloor, prepared once, on a file of its own opened by
// sqlitestore.Open, so with the store's settings and table.
type sqliteFloor struct {
	*sqlitefloor.Floor
	payload []byte
}

// newSQLiteFloor makes the payments' table in the file of db, the floor's
// own (the records' table is sqlitestore.Open's), and prepares the floor's
// statements.
func newSQLiteFloor(db *sql.DB, payload []byte) (*sqliteFloor, error) {
	f, err := sqlitefloor.New(context.Background(), db, sqlitefloor.Record{
		Fingerprint: fingerprint, Header: headerBlock, Body: payload, Lease: time.Minute, TTL: ttl})
	if err != nil {
		return nil, err
	}
	return &sqliteFloor{Floor: f, payload: payload}, nil
}

// handler is the floor of replays and first executions: one SELECT by
// primary key; or an INSERT, the handler, an UPDATE, each committed on its
// own.
func (f *sqliteFloor) handler() http.Handler {
	next := load.Handler(f.payload)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		if dup(r) {
			body, err := f.Read(r.Context(), key)
			if err != nil {
				unavailable(w, err)
				return
			}
			answer(w, body)
			return
		}
		if err := f.Create(r.Context(), key); err != nil {
			unavailable(w, err)
			return
		}
		next.ServeHTTP(w, r)
		_ = http.NewResponseController(w).Flush()
		_ = f.Store(r.Context(), key)
	})
}

// txHandler is the transactional record floor: the record's INSERT, then
// one BEGIN IMMEDIATE transaction holding the payment's INSERT and the
// record's UPDATE, then the response (sent after the commit, as the
// middleware sends it).
func (f *sqliteFloor) txHandler() http.Handler {
	next := load.Handler(f.payload)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = dup(r)
		key := r.Header.Get("Idempotency-Key")
		if err := f.Create(r.Context(), key); err != nil {
			unavailable(w, err)
			return
		}
		if err := f.StoreWithPayment(r.Context(), key, len(reqBody)); err != nil {
			unavailable(w, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// sqlitePayHandler is the handler of SQLite's transactional route: it
// inserts the payment row in the request's transaction, then answers.
func sqlitePayHandler(payload []byte) http.Handler {
	next := load.Handler(payload)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, ok := sqlitestore.TxFromContext(r.Context())
		if !ok {
			http.Error(w, "no transaction", http.StatusInternalServerError)
			return
		}
		if _, err := tx.ExecContext(r.Context(), sqlitefloor.PaymentSQL, r.Header.Get("Idempotency-Key"), len(reqBody)); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		next.ServeHTTP(w, r)
	})
}
