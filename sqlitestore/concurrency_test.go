package sqlitestore_test

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/sqlitestore"
)

const concurrentClients, concurrentKeys = 32, 200

// counted wraps a handler of the key it ran: it counts the key's runs and
// answers "ran key-N" when the handler succeeded.
type counted struct{ runs [concurrentKeys]atomic.Int64 }

func (c *counted) handler(run func(r *http.Request, key string) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var k int
		fmt.Sscanf(r.Header.Get(idempotency.HeaderKey), "key-%d", &k)
		c.runs[k].Add(1)
		key := fmt.Sprintf("key-%d", k)
		if err := run(r, key); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintf(w, "ran %s", key)
	})
}

// hammer has concurrentClients clients send the same concurrentKeys keys,
// each in its own order, to route(k), the middleware on one file. Each
// key must run exactly once, and every other answer must be its replay or
// a 409 for a duplicate in flight.
func hammer(t *testing.T, c *counted, route func(k int) http.Handler) {
	t.Helper()
	var (
		wg                   sync.WaitGroup
		fresh, replays, busy atomic.Int64
		mu                   sync.Mutex
		unexpected           []string
	)
	for range concurrentClients {
		wg.Go(func() {
			for _, k := range rand.Perm(concurrentKeys) {
				req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader("amount=1"))
				req.Header.Set(idempotency.HeaderKey, fmt.Sprintf("key-%d", k))
				rec := httptest.NewRecorder()
				route(k).ServeHTTP(rec, req)
				switch {
				case rec.Code == http.StatusOK && rec.Body.String() == fmt.Sprintf("ran key-%d", k):
					if rec.Header().Get(idempotency.HeaderReplayed) == "true" {
						replays.Add(1)
					} else {
						fresh.Add(1)
					}
				case rec.Code == http.StatusConflict:
					busy.Add(1)
				default:
					mu.Lock()
					unexpected = append(unexpected, fmt.Sprintf("key-%d: %d %q", k, rec.Code, rec.Body.String()))
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	for _, u := range unexpected {
		t.Error(u)
	}
	for k := range c.runs {
		if n := c.runs[k].Load(); n != 1 {
			t.Errorf("key-%d ran %d times, want once", k, n)
		}
	}
	if fresh.Load() != concurrentKeys {
		t.Errorf("%d first executions answered, want %d", fresh.Load(), concurrentKeys)
	}
	t.Logf("%d requests: %d executions, %d replays, %d in flight (409)", concurrentClients*concurrentKeys, fresh.Load(), replays.Load(), busy.Load())
}

// TestMiddlewareConcurrency: 32 clients send the same 200 keys, each in
// its own order, through the middleware on one file. Every handler run is
// counted: each key runs exactly once, and every other answer is its
// replay or a 409 for a duplicate in flight.
func TestMiddlewareConcurrency(t *testing.T) {
	s := open(t, newPath(t))
	var c counted
	h := idempotency.New(s)(c.handler(func(*http.Request, string) error { return nil }))
	hammer(t, &c, func(int) http.Handler { return h })
}

// TestMiddlewareConcurrencyMixed: as TestMiddlewareConcurrency, with half
// the keys sent to a transactional route that writes a payment row in the
// request's transaction and half to a plain route, on one Store with two
// connections in its pool: transactions, the Store's writes and the reads
// that take the writer's connection when it is free share it. Each key
// runs exactly once, each transactional key leaves one payment row, and
// every answer is the key's own.
func TestMiddlewareConcurrencyMixed(t *testing.T) {
	s := open(t, newPath(t), sqlitestore.WithMaxConns(2))
	if _, err := s.DB().ExecContext(ctx, bankSchema); err != nil {
		t.Fatal(err)
	}
	var c counted
	plain := idempotency.New(s)(c.handler(func(*http.Request, string) error { return nil }))
	transactional := idempotency.New(s, idempotency.WithTransaction(true))(c.handler(func(r *http.Request, key string) error {
		tx, _ := sqlitestore.TxFromContext(r.Context())
		_, err := tx.ExecContext(r.Context(), `INSERT INTO payments (idem_key, epoch, amount) VALUES (?, 1, 1)`, key)
		return err
	}))
	hammer(t, &c, func(k int) http.Handler {
		if k%2 == 0 {
			return transactional
		}
		return plain
	})
	var payments, distinct int
	if err := s.DB().QueryRowContext(ctx, `SELECT count(*), count(DISTINCT idem_key) FROM payments`).Scan(&payments, &distinct); err != nil {
		t.Fatal(err)
	}
	if want := concurrentKeys / 2; payments != want || distinct != want {
		t.Errorf("%d payment rows for %d keys, want %d for %d", payments, distinct, want, want)
	}
	if n := s.OpenTxs(); n != 0 {
		t.Errorf("%d transactions left open", n)
	}
}
