package pgstore_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/pgstore"
)

// counter counts what a pool sends: queries (through pgx's QueryTracer)
// and writes on its connections, each of which is a round trip (pgx writes
// a query's messages, Sync included, in one write and then waits for the
// reply).
type counter struct {
	writes atomic.Int64

	mu      sync.Mutex
	queries []string // the first word of each
	args    [][]any
}

func (c *counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.queries = append(c.queries, strings.Fields(data.SQL)[0])
	c.args = append(c.args, data.Args)
	return ctx
}

func (c *counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *counter) reset() {
	c.writes.Store(0)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.queries, c.args = nil, nil
}

func (c *counter) sent() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.queries...)
}

type countingConn struct {
	net.Conn
	c *counter
}

func (cc countingConn) Write(b []byte) (int, error) {
	cc.c.writes.Add(1)
	return cc.Conn.Write(b)
}

// countedPool returns a pool of one connection whose queries and round
// trips c counts.
func countedPool(t *testing.T, c *counter) *pgxpool.Pool {
	return newPool(t, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 1
		cfg.ConnConfig.Tracer = c
		dial := cfg.ConnConfig.DialFunc
		cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return countingConn{conn, c}, nil
		}
	})
}

// TestRoundTrips counts the statements and round trips of each edge, on a
// warm connection (pgx prepares a statement the first time a connection
// runs it, which costs one more round trip, once).
func TestRoundTrips(t *testing.T) {
	c := &counter{}
	s := newStore(t, countedPool(t, c))

	warm := func() {
		key := randKey()
		mustAcquire(t, s, req(key, "w"), idempotency.Acquired)
		mustAcquire(t, s, req(key, "x"), idempotency.InFlight)
		if err := s.Extend(ctx, key, "w", time.Second); err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, key, "w", sampleResponse(), time.Hour); err != nil {
			t.Fatal(err)
		}
		mustAcquire(t, s, req(key, "y"), idempotency.Completed)
		mustAcquire(t, s, req(randKey(), "w"), idempotency.Acquired)
		if err := s.Release(ctx, key, "w"); err == nil {
			t.Fatal("Release of COMPLETE succeeded")
		}
	}
	warm()

	check := func(what string, want int64, f func()) {
		t.Helper()
		c.reset()
		f()
		if got := int64(len(c.sent())); got != want {
			t.Errorf("%s: %d statements %v, want %d", what, got, c.sent(), want)
		}
		if got := c.writes.Load(); got != want {
			t.Errorf("%s: %d round trips, want %d", what, got, want)
		}
	}
	key := randKey()
	check("first execution (acquire + complete)", 2, func() {
		mustAcquire(t, s, req(key, "t1"), idempotency.Acquired)
		if err := s.Complete(ctx, key, "t1", sampleResponse(), time.Hour); err != nil {
			t.Fatal(err)
		}
	})
	check("replay", 1, func() {
		a := mustAcquire(t, s, req(key, "t2"), idempotency.Completed)
		if a.Response == nil || a.Response.Status != 201 {
			t.Fatalf("replay response %+v", a.Response)
		}
	})
	other := randKey()
	mustAcquire(t, s, req(other, "t1"), idempotency.Acquired)
	check("conflict", 1, func() { mustAcquire(t, s, req(other, "t2"), idempotency.InFlight) })
	check("mismatch", 1, func() {
		r := req(other, "t3")
		r.Fingerprint = "other"
		mustAcquire(t, s, r, idempotency.Mismatch)
	})
	check("extend", 1, func() {
		if err := s.Extend(ctx, other, "t1", time.Second); err != nil {
			t.Fatal(err)
		}
	})
	check("release", 1, func() {
		if err := s.Release(ctx, other, "t1"); err != nil {
			t.Fatal(err)
		}
	})
}

// TestRoundTripsThroughMiddleware counts what the middleware sends: a
// first execution of a fast handler costs two round trips (acquire,
// complete) and a replay one. On a transactional route the handler's
// transaction adds BEGIN and COMMIT to its own statements.
func TestRoundTripsThroughMiddleware(t *testing.T) {
	c := &counter{}
	pool := countedPool(t, c)
	if _, err := pool.Exec(ctx, `CREATE TABLE payments (key text NOT NULL, amount int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	s := newStore(t, pool)
	plain := idempotency.New(s)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "paid")
	}))
	tx := idempotency.New(s, idempotency.WithTransaction(true))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, _ := idempotency.FromContext(r.Context())
		tx, _ := pgstore.TxFromContext(r.Context())
		if _, err := tx.Exec(r.Context(), `INSERT INTO payments (key, amount) VALUES ($1, 100)`, info.Key); err != nil {
			t.Error(err)
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "paid")
	}))
	post := func(h http.Handler, key string) *http.Response {
		r := httptest.NewRequest(http.MethodPost, "/pay", nil)
		r.Header.Set(idempotency.HeaderKey, key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Result()
	}
	// Warm the connection's statement cache on both routes.
	for _, h := range []http.Handler{plain, tx} {
		key := randKey()
		post(h, key)
		post(h, key)
	}

	check := func(what string, want int64, f func()) {
		t.Helper()
		c.reset()
		f()
		if got := c.writes.Load(); got != want {
			t.Errorf("%s: %d round trips %v, want %d", what, got, c.sent(), want)
		}
		t.Logf("%s: %d round trips %v", what, c.writes.Load(), c.sent())
	}
	for _, route := range []struct {
		name        string
		h           http.Handler
		first, dups int64
	}{
		{"plain route", plain, 2, 1},
		{"transactional route", tx, 5, 1}, // acquire, BEGIN, INSERT, complete (the fence), COMMIT
	} {
		key := randKey()
		check(route.name+", first execution", route.first, func() {
			if res := post(route.h, key); res.StatusCode != http.StatusCreated {
				t.Fatalf("first: %d", res.StatusCode)
			}
		})
		check(route.name+", replay", route.dups, func() {
			if res := post(route.h, key); res.Header.Get(idempotency.HeaderReplayed) != "true" {
				t.Fatalf("duplicate not replayed: %d", res.StatusCode)
			}
		})
	}
}
