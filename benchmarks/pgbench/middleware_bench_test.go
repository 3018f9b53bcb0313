package pgbench

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/benchmarks/load"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/pgstore"
)

// The benchmarks run three sets of four sides each. Every side answers
// the same request with the same response (201 and a 1 KiB JSON body,
// which load.Handler writes where a side runs the handler), on the same
// pool, so that the sides differ only in what they do to give it:
//
//   - replay: Floor1 (one trivial round trip), Record1 (the record floor:
//     one SELECT by primary key of a COMPLETE row holding the payload,
//     written back as the response), Store1 (the store's own Acquire of a
//     COMPLETE record, its response written back) and Replay (the
//     middleware);
//   - first execution: Floor2 (the handler between two trivial round
//     trips), Record2 (the record floor: the handler between one INSERT of
//     an in-progress row and one UPDATE that stores the payload in it),
//     Store2 (Acquire, the handler, Complete) and FirstExecution (the
//     middleware);
//   - transactional completion, where the handler also inserts a payment
//     row: TxOwn (the handler writing its row in a transaction of its own,
//     without the middleware: BEGIN, INSERT, COMMIT), TxRecord (the record
//     floor of a transactional store: an INSERT of an in-progress row, then
//     BEGIN, the payment's INSERT, an UPDATE that stores the payload in the
//     record, COMMIT), TxStore (the store's own Acquire, BeginTx and
//     Tx.Complete around the payment's INSERT) and TxMiddleware (the
//     middleware with idempotency.WithTransaction).
//
// The record floors write to a table of the store's own schema
// (pgstore.Schema: the same columns and indexes) with plain statements
// that check nothing and read the server's clock with now(). The store's
// statements write the same rows, and judge leases, tokens and
// fingerprints on the way.

// The tables: the store's (pgstore.Migrate), the record floors' and the
// payments of the transactional set.
const (
	floorTable     = "floor_records"
	paymentsSchema = `CREATE TABLE payments (id bigserial PRIMARY KEY, idem_key text NOT NULL, amount int NOT NULL)`
)

// The plain statements of the floors.
const (
	roundTripSQL  = `SELECT 1`
	recordReadSQL = `SELECT status, headers, body FROM floor_records WHERE key = $1`
	recordNewSQL  = `INSERT INTO floor_records (key, state, token, fingerprint, epoch, lease_until, ttl_until, updated_at)
VALUES ($1, 'in_progress', $2, $3, 1, now() + $4::interval, now() + $5::interval, now())`
	recordDoneSQL = `UPDATE floor_records SET state = 'complete', status = $2, headers = $3, body = $4, body_omitted = false,
	ttl_until = now() + $5::interval, updated_at = now() WHERE key = $1`
	// recordsSQL stores COMPLETE rows for the keys $1, for Record1.
	recordsSQL = `INSERT INTO floor_records (key, state, token, fingerprint, epoch, lease_until, ttl_until, status, headers, body, body_omitted, updated_at)
SELECT k, 'complete', 't', $2, 1, now(), now() + $3::interval, 201, $4, $5, false, now() FROM unnest($1::text[]) AS k`
	paymentSQL = `INSERT INTO payments (idem_key, amount) VALUES ($1, $2)`
)

// The lease and TTL of the floors and the store-alone sides: the
// middleware's defaults.
const (
	lease = 10 * time.Second
	ttl   = 24 * time.Hour
)

// replayKeys is how many COMPLETE records each replay side reads, in turn:
// duplicates of many keys, as retries from many clients are.
const replayKeys = 256

var (
	fingerprint = []byte(strings.Repeat("f", 64))
	// headerBlock stands, in the floor's rows, for the status-and-headers
	// block the store keeps; it is about its size.
	headerBlock = []byte("\x00\x00\x00\xc9Content-Type\x00application/json\x00Content-Length\x001024\x00")
	ctype       = []string{"application/json"}
	txOptions   = pgx.TxOptions{IsoLevel: pgx.ReadCommitted} // pgstore's default
)

// env is what the sides of a set share.
type env struct {
	pool    *pgxpool.Pool
	store   *pgstore.Store
	payload []byte
	tokens  atomic.Int64
}

// newEnv returns an env on a database of its own for b, with a pool of
// maxConns connections, the tables made and a 1 KiB payload.
func newEnv(tb testing.TB, maxConns int32) *env {
	pool := pgtest.Pool(tb, func(c *pgxpool.Config) { c.MaxConns = maxConns })
	if err := pgstore.Migrate(ctx, pool); err != nil {
		tb.Fatal(err)
	}
	if _, err := pool.Exec(ctx, pgstore.Schema(floorTable)+";"+paymentsSchema); err != nil {
		tb.Fatal(err)
	}
	store := pgstore.New(pool)
	tb.Cleanup(func() { store.Close() })
	return &env{pool: pool, store: store, payload: load.Payload(1 << 10)}
}

// token returns a fresh lease token of the middleware's length.
func (e *env) token() string { return fmt.Sprintf("%032x", e.tokens.Add(1)) }

func (e *env) acquireReq(key, token string) idempotency.AcquireRequest {
	return idempotency.AcquireRequest{Key: key, Token: token, Fingerprint: string(fingerprint), Lease: lease, TTL: ttl}
}

// response is what load.Handler writes, as the store keeps it.
func (e *env) response() *idempotency.Response {
	return &idempotency.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": ctype}, Body: e.payload}
}

// A side is one kind of request of a set: setup returns its handler and
// the key of request i, for requests i < n.
type side struct {
	name  string
	setup func(tb testing.TB, e *env, n int) (http.Handler, func(i int) []string)
}

// set is the sides measured side by side: floor, record floor, store alone
// and middleware, in that order.
type set struct {
	name  string
	sides [4]side
}

var sets = []set{
	{"Replay", [4]side{
		{"Floor1", func(tb testing.TB, e *env, n int) (http.Handler, func(int) []string) {
			return roundTrips(e, 1), constant
		}},
		{"Record1", func(tb testing.TB, e *env, n int) (http.Handler, func(int) []string) {
			ks := keys(replayKeys)
			flat := make([]string, len(ks))
			for j, k := range ks {
				flat[j] = k[0]
			}
			if _, err := e.pool.Exec(ctx, recordsSQL, flat, fingerprint, ttl, headerBlock, e.payload); err != nil {
				tb.Fatal(err)
			}
			return recordRead(e), cycle(ks)
		}},
		{"Store1", func(tb testing.TB, e *env, n int) (http.Handler, func(int) []string) {
			ks := keys(replayKeys)
			if err := prepare(len(ks), func(j int) error {
				tok := e.token()
				if _, err := e.store.Acquire(ctx, e.acquireReq(ks[j][0], tok)); err != nil {
					return err
				}
				return e.store.Complete(ctx, ks[j][0], tok, e.response(), ttl)
			}); err != nil {
				tb.Fatal(err)
			}
			return storeAlone(e), cycle(ks)
		}},
		{"Replay", func(tb testing.TB, e *env, n int) (http.Handler, func(int) []string) {
			h := idempotency.New(e.store)(load.Handler(e.payload))
			ks := keys(replayKeys)
			if err := prepare(len(ks), func(j int) error {
				if _, st := requester(h, func(int) []string { return ks[j] })(0); st != http.StatusCreated {
					return fmt.Errorf("first request: status %d", st)
				}
				return nil
			}); err != nil {
				tb.Fatal(err)
			}
			return h, cycle(ks)
		}},
	}},
	{"FirstExecution", [4]side{
		{"Floor2", func(tb testing.TB, e *env, n int) (http.Handler, func(int) []string) {
			return roundTrips(e, 2), constant
		}},
		{"Record2", func(tb testing.TB, e *env, n int) (http.Handler, func(int) []string) {
			return recordWrite(e), fresh(n)
		}},
		{"Store2", func(tb testing.TB, e *env, n int) (http.Handler, func(int) []string) {
			return storeAlone(e), fresh(n)
		}},
		{"FirstExecution", func(tb testing.TB, e *env, n int) (http.Handler, func(int) []string) {
			return idempotency.New(e.store)(load.Handler(e.payload)), fresh(n)
		}},
	}},
	{"Transaction", [4]side{
		{"TxOwn", func(tb testing.TB, e *env, n int) (http.Handler, func(int) []string) {
			return ownTx(e), fresh(n)
		}},
		{"TxRecord", func(tb testing.TB, e *env, n int) (http.Handler, func(int) []string) {
			return recordTx(e), fresh(n)
		}},
		{"TxStore", func(tb testing.TB, e *env, n int) (http.Handler, func(int) []string) {
			return storeTx(e), fresh(n)
		}},
		{"TxMiddleware", func(tb testing.TB, e *env, n int) (http.Handler, func(int) []string) {
			return idempotency.New(e.store, idempotency.WithTransaction(true))(payHandler(e)), fresh(n)
		}},
	}},
}

var constantKey = keys(1)[0]

// constant gives every request the same key, for the sides that read none.
func constant(int) []string { return constantKey }

// cycle gives request i the key ks[i mod len(ks)].
func cycle(ks [][]string) func(int) []string {
	return func(i int) []string { return ks[i%len(ks)] }
}

// fresh gives each of n requests a key of its own.
func fresh(n int) func(int) []string {
	ks := keys(n)
	return func(i int) []string { return ks[i] }
}

// unavailable answers 503 with err.
func unavailable(w http.ResponseWriter, err error) {
	http.Error(w, err.Error(), http.StatusServiceUnavailable)
}

// roundTrips is Floor1 (trips 1: a round trip, then the handler) and Floor2
// (trips 2: the handler between two round trips).
func roundTrips(e *env, trips int) http.Handler {
	next := load.Handler(e.payload)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := e.pool.Exec(r.Context(), roundTripSQL); err != nil {
			unavailable(w, err)
			return
		}
		next.ServeHTTP(w, r)
		if trips > 1 {
			// The response is written: as in load.FloorHandler, a failed
			// second trip can change nothing in it.
			_, _ = e.pool.Exec(r.Context(), roundTripSQL)
		}
	})
}

// recordRead is Record1: one SELECT by primary key of a COMPLETE row, its
// status and body written back.
func recordRead(e *env) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var status int32
		var headers, body []byte
		if err := e.pool.QueryRow(r.Context(), recordReadSQL, r.Header["Idempotency-Key"][0]).Scan(&status, &headers, &body); err != nil {
			unavailable(w, err)
			return
		}
		w.Header()["Content-Type"] = ctype
		w.WriteHeader(int(status))
		_, _ = w.Write(body)
	})
}

// recordWrite is Record2: the handler between one INSERT of an in-progress
// row and one UPDATE storing the payload in it.
func recordWrite(e *env) http.Handler {
	next := load.Handler(e.payload)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header["Idempotency-Key"][0]
		if _, err := e.pool.Exec(r.Context(), recordNewSQL, key, e.token(), fingerprint, lease, ttl); err != nil {
			unavailable(w, err)
			return
		}
		next.ServeHTTP(w, r)
		_, _ = e.pool.Exec(r.Context(), recordDoneSQL, key, int32(http.StatusCreated), headerBlock, e.payload, ttl)
	})
}

// storeAlone is Store1 and Store2: the store's Acquire; then either the
// stored response written back, or the handler and Complete.
func storeAlone(e *env) http.Handler {
	next := load.Handler(e.payload)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, token := r.Header["Idempotency-Key"][0], e.token()
		acq, err := e.store.Acquire(r.Context(), e.acquireReq(key, token))
		if err != nil {
			unavailable(w, err)
			return
		}
		if acq.Outcome == idempotency.Completed {
			for name, v := range acq.Response.Header {
				w.Header()[name] = v
			}
			w.WriteHeader(acq.Response.Status)
			_, _ = w.Write(acq.Response.Body)
			return
		}
		next.ServeHTTP(w, r)
		_ = e.store.Complete(r.Context(), key, token, e.response(), ttl)
	})
}

// insertPayment is the transactional handler's write.
func insertPayment(r *http.Request, tx pgx.Tx) error {
	_, err := tx.Exec(r.Context(), paymentSQL, r.Header["Idempotency-Key"][0], int32(len(reqBody)))
	return err
}

// payHandler is TxMiddleware's handler: it inserts the payment row in the
// request's transaction, then answers as load.Handler does.
func payHandler(e *env) http.Handler {
	next := load.Handler(e.payload)
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

// ownTx is TxOwn: the same handler, in a transaction of its own (BEGIN,
// the INSERT, COMMIT).
func ownTx(e *env) http.Handler {
	next := load.Handler(e.payload)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := pgx.BeginTxFunc(r.Context(), e.pool, txOptions, func(tx pgx.Tx) error {
			return insertPayment(r, tx)
		}); err != nil {
			unavailable(w, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// recordTx is TxRecord: an INSERT of an in-progress row, then a
// transaction that inserts the payment and stores the payload in the row.
func recordTx(e *env) http.Handler {
	next := load.Handler(e.payload)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header["Idempotency-Key"][0]
		if _, err := e.pool.Exec(r.Context(), recordNewSQL, key, e.token(), fingerprint, lease, ttl); err != nil {
			unavailable(w, err)
			return
		}
		if err := pgx.BeginTxFunc(r.Context(), e.pool, txOptions, func(tx pgx.Tx) error {
			if err := insertPayment(r, tx); err != nil {
				return err
			}
			_, err := tx.Exec(r.Context(), recordDoneSQL, key, int32(http.StatusCreated), headerBlock, e.payload, ttl)
			return err
		}); err != nil {
			unavailable(w, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// storeTx is TxStore: the store's Acquire, BeginTx, the payment's INSERT
// in that transaction, and Tx.Complete.
func storeTx(e *env) http.Handler {
	next := load.Handler(e.payload)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, token := r.Header["Idempotency-Key"][0], e.token()
		if _, err := e.store.Acquire(r.Context(), e.acquireReq(key, token)); err != nil {
			unavailable(w, err)
			return
		}
		tx, err := e.store.BeginTx(r.Context(), key, token)
		if err != nil {
			unavailable(w, err)
			return
		}
		if err := insertPayment(r, tx.Handle().(pgx.Tx)); err != nil {
			_ = tx.Rollback(r.Context())
			unavailable(w, err)
			return
		}
		if err := tx.Complete(r.Context(), e.response(), ttl); err != nil {
			unavailable(w, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// setupSet sets up the sides of s on e with room for n requests each, and
// returns a function that makes a requester per side (one per goroutine).
func setupSet(tb testing.TB, e *env, s set, n int) func() [4]func(i int) (time.Duration, int) {
	var hs [4]http.Handler
	var ks [4]func(int) []string
	for j, sd := range s.sides {
		hs[j], ks[j] = sd.setup(tb, e, n)
	}
	return func() (sends [4]func(int) (time.Duration, int)) {
		for j := range sends {
			sends[j] = requester(hs[j], ks[j])
		}
		return sends
	}
}

// BenchmarkMiddlewarePostgresPaired measures, from one client, the
// middleware against its floors in lockstep: every op sends one request to
// each side of a set (floor, record floor, store alone, middleware), in an
// order that rotates from op to op, so that all four see the same
// background load. It reports the mean time of each kind of request and
// their ratios (see reportSet). One request per side, untimed, comes
// first, so that the connection has prepared every statement.
func BenchmarkMiddlewarePostgresPaired(b *testing.B) {
	e := newEnv(b, 8)
	for _, s := range sets {
		b.Run(fmt.Sprintf("%s/body=%d", s.name, len(e.payload)), func(b *testing.B) {
			sends := setupSet(b, e, s, b.N+1)()
			for j := range sends {
				if _, got := sends[j](b.N); got != http.StatusCreated {
					b.Fatalf("%s: status %d", s.sides[j].name, got)
				}
			}
			var total [4]time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for j := range 4 {
					k := (i + j) % 4
					d, got := sends[k](i)
					if got != http.StatusCreated {
						b.Fatalf("%s: status %d", s.sides[k].name, got)
					}
					total[k] += d
				}
			}
			b.StopTimer()
			reportSet(b, total, b.N)
		})
	}
}

// BenchmarkMiddlewarePostgresPhased measures the middleware against its
// floors with 64 concurrent clients, in phases that alternate quickly:
// each op runs four phases, one per side of a set, in an order that
// rotates from op to op, and in each phase 64 goroutines send 25 requests
// each. Phases a fraction of a second long see the same background load.
// The pool has a connection per client. One phase per side, untimed, comes
// first, so that the connections exist and have prepared the statements.
// It reports the time per request of each side (the inverse of its
// throughput) and their ratios (see reportSet).
func BenchmarkMiddlewarePostgresPhased(b *testing.B) {
	const clients, perPhase = 64, 25
	e := newEnv(b, clients)
	for _, s := range sets {
		b.Run(fmt.Sprintf("%s/body=%d/clients=%d", s.name, len(e.payload), clients), func(b *testing.B) {
			newSends := setupSet(b, e, s, (b.N+1)*clients*perPhase)
			var sends [clients][4]func(i int) (time.Duration, int)
			for g := range sends {
				sends[g] = newSends()
			}
			var failed atomic.Value
			phase := func(i, k int) time.Duration {
				return runPhase(clients, perPhase, func(g, r int) {
					if _, got := sends[g][k]((i*clients+g)*perPhase + r); got != http.StatusCreated {
						failed.CompareAndSwap(nil, fmt.Sprintf("%s: status %d", s.sides[k].name, got))
					}
				})
			}
			for k := range 4 {
				phase(b.N, k)
			}
			var total [4]time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for j := range 4 {
					k := (i + j) % 4
					total[k] += phase(i, k)
				}
			}
			b.StopTimer()
			if msg := failed.Load(); msg != nil {
				b.Fatal(msg)
			}
			reportSet(b, total, b.N*clients*perPhase)
		})
	}
}

// reportSet reports the time per request of floor, record floor, store
// alone and middleware (total holds the time each took for requests
// requests: floor-µs/req, record-µs/req, store-µs/req, mw-µs/req), the
// ratios of the others to the floor (mw/floor, record/floor, store/floor),
// and the middleware's to the record floor (mw/record) and to the store
// alone (mw/store). The targets: a replay and a first execution within
// 1.25× their record floor (mw/record), transactional completion within
// 1.25× the handler's own transaction (mw/floor of the Transaction set).
func reportSet(b *testing.B, total [4]time.Duration, requests int) {
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(requests) }
	for j, name := range []string{"floor", "record", "store", "mw"} {
		b.ReportMetric(us(total[j]), name+"-µs/req")
	}
	ratio := func(x, y time.Duration) float64 { return float64(x) / float64(y) }
	b.ReportMetric(ratio(total[3], total[0]), "mw/floor")
	b.ReportMetric(ratio(total[1], total[0]), "record/floor")
	b.ReportMetric(ratio(total[2], total[0]), "store/floor")
	b.ReportMetric(ratio(total[3], total[1]), "mw/record")
	b.ReportMetric(ratio(total[3], total[2]), "mw/store")
}

// TestSides checks that every side answers 201 and does the writes it
// stands for: a replay side writes no record, a first-execution side one
// COMPLETE record per request (the record floor in its own table), and a
// transactional side one record and one payment row per request.
func TestSides(t *testing.T) {
	e := newEnv(t, 8)
	count := func(sql string) int {
		var n int
		if err := e.pool.QueryRow(ctx, sql).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	counts := func() [3]int {
		return [3]int{
			count(`SELECT count(*) FROM idempotency_records WHERE state = 'complete'`),
			count(`SELECT count(*) FROM floor_records WHERE state = 'complete'`),
			count(`SELECT count(*) FROM payments`),
		}
	}
	const n = 4
	// Each side's new COMPLETE records, floor rows and payments.
	want := map[string][3]int{"Replay": {}, "FirstExecution": {2 * n, n, 0}, "Transaction": {2 * n, n, 4 * n}}
	for _, s := range sets {
		t.Run(s.name, func(t *testing.T) {
			sends := setupSet(t, e, s, n)()
			before := counts()
			for j, send := range sends {
				for i := range n {
					if _, got := send(i); got != http.StatusCreated {
						t.Fatalf("%s: status %d", s.sides[j].name, got)
					}
				}
			}
			after := counts()
			for k := range after {
				after[k] -= before[k]
			}
			if after != want[s.name] {
				t.Fatalf("new records, floor rows and payments %v, want %v", after, want[s.name])
			}
		})
	}
}
