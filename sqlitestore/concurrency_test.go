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

// TestMiddlewareConcurrency: 32 clients send the same 200 keys, each in
// its own order, through the middleware on one file. Every handler run is
// counted: each key runs exactly once, and every other answer is its
// replay or a 409 for a duplicate in flight.
func TestMiddlewareConcurrency(t *testing.T) {
	const clients, keys = 32, 200
	s := open(t, newPath(t))
	var runs [keys]atomic.Int64
	h := idempotency.New(s)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var k int
		fmt.Sscanf(r.Header.Get(idempotency.HeaderKey), "key-%d", &k)
		runs[k].Add(1)
		fmt.Fprintf(w, "ran key-%d", k)
	}))
	var (
		wg                   sync.WaitGroup
		fresh, replays, busy atomic.Int64
		mu                   sync.Mutex
		unexpected           []string
	)
	for range clients {
		wg.Go(func() {
			for _, k := range rand.Perm(keys) {
				req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader("amount=1"))
				req.Header.Set(idempotency.HeaderKey, fmt.Sprintf("key-%d", k))
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
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
	for k := range runs {
		if n := runs[k].Load(); n != 1 {
			t.Errorf("key-%d ran %d times, want once", k, n)
		}
	}
	if fresh.Load() != keys {
		t.Errorf("%d first executions answered, want %d", fresh.Load(), keys)
	}
	t.Logf("%d requests: %d executions, %d replays, %d in flight (409)", clients*keys, fresh.Load(), replays.Load(), busy.Load())
}

// TestMiddlewareConcurrencyMixed: 32 clients send the same 200 keys, each
// in its own order, half of them to a transactional route that writes a
// payment row in the request's transaction and half to a plain route, on
// one Store with two connections in its pool: transactions, the Store's
// writes and the reads that take the writer's connection when it is free
// share it. Each key runs exactly once, each transactional key leaves one
// payment row, and every answer is the key's own.
func TestMiddlewareConcurrencyMixed(t *testing.T) {
	const clients, keys = 32, 200
	s := open(t, newPath(t), sqlitestore.WithMaxConns(2))
	if _, err := s.DB().ExecContext(ctx, bankSchema); err != nil {
		t.Fatal(err)
	}
	var runs [keys]atomic.Int64
	run := func(r *http.Request) int {
		var k int
		fmt.Sscanf(r.Header.Get(idempotency.HeaderKey), "key-%d", &k)
		runs[k].Add(1)
		return k
	}
	plain := idempotency.New(s)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "ran key-%d", run(r))
	}))
	transactional := idempotency.New(s, idempotency.WithTransaction(true))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k := run(r)
		tx, _ := sqlitestore.TxFromContext(r.Context())
		if _, err := tx.ExecContext(r.Context(), `INSERT INTO payments (idem_key, epoch, amount) VALUES (?, 1, 1)`, fmt.Sprintf("key-%d", k)); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintf(w, "ran key-%d", k)
	}))
	var (
		wg                   sync.WaitGroup
		fresh, replays, busy atomic.Int64
		mu                   sync.Mutex
		unexpected           []string
	)
	for range clients {
		wg.Go(func() {
			for _, k := range rand.Perm(keys) {
				h := plain
				if k%2 == 0 {
					h = transactional
				}
				req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader("amount=1"))
				req.Header.Set(idempotency.HeaderKey, fmt.Sprintf("key-%d", k))
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
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
	for k := range runs {
		if n := runs[k].Load(); n != 1 {
			t.Errorf("key-%d ran %d times, want once", k, n)
		}
	}
	var payments, distinct int
	if err := s.DB().QueryRowContext(ctx, `SELECT count(*), count(DISTINCT idem_key) FROM payments`).Scan(&payments, &distinct); err != nil {
		t.Fatal(err)
	}
	if payments != keys/2 || distinct != keys/2 {
		t.Errorf("%d payment rows for %d keys, want %d for %d", payments, distinct, keys/2, keys/2)
	}
	if fresh.Load() != keys {
		t.Errorf("%d first executions answered, want %d", fresh.Load(), keys)
	}
	if n := s.OpenTxs(); n != 0 {
		t.Errorf("%d transactions left open", n)
	}
	t.Logf("%d requests: %d executions, %d replays, %d in flight (409)", clients*keys, fresh.Load(), replays.Load(), busy.Load())
}
