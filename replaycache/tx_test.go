package replaycache_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/replaycache"
)

// txStore is a small TxStore over a memstore: a transaction's rows commit
// with the record, under one lock.
type txStore struct {
	idempotency.Store
	mu   sync.Mutex
	rows []string
}

func (s *txStore) BeginTx(ctx context.Context, key, token string) (idempotency.Tx, error) {
	return &memTx{s: s, key: key, token: token}, nil
}

type memTx struct {
	s          *txStore
	key, token string
	staged     []string
}

func (tx *memTx) Handle() any { return tx }

func (tx *memTx) Complete(ctx context.Context, resp *idempotency.Response, ttl time.Duration) error {
	tx.s.mu.Lock()
	defer tx.s.mu.Unlock()
	if err := tx.s.Store.Complete(ctx, tx.key, tx.token, resp, ttl); err != nil {
		return err
	}
	tx.s.rows = append(tx.s.rows, tx.staged...)
	return nil
}

func (tx *memTx) Rollback(context.Context) error { return nil }

// post sends a POST with key to h and returns its status, body and
// whether it was a replay.
func post(h http.Handler, key string) (int, string, bool) {
	req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":100}`))
	req.Header.Set(idempotency.HeaderKey, key)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	body, _ := io.ReadAll(rec.Body)
	return rec.Code, string(body), rec.Header().Get(idempotency.HeaderReplayed) == "true"
}

// TestTxCacheKeepsTransactions: behind a TxCache, a route with
// WithTransaction still writes the handler's rows in the record's
// transaction, and duplicates are replayed from the cache. Behind a plain
// Cache the same route is refused at construction.
func TestTxCacheKeepsTransactions(t *testing.T) {
	t.Parallel()
	store := &txStore{Store: newMemstore(t, nil)}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("WithTransaction accepted a Cache made by New")
			}
		}()
		idempotency.New(replaycache.New(store), idempotency.WithTransaction(true))
	}()

	c := replaycache.NewTx(store)
	h := idempotency.New(c, idempotency.WithTransaction(true))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, _ := idempotency.FromContext(r.Context())
		tx := info.Tx.(*memTx)
		tx.staged = append(tx.staged, "payment "+info.Key)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "paid "+info.Key)
	}))
	for i := range 4 {
		status, body, replayed := post(h, "order-1")
		if status != http.StatusCreated || body != "paid order-1" || replayed != (i > 0) {
			t.Fatalf("request %d: %d %q replayed=%v", i, status, body, replayed)
		}
	}
	if len(store.rows) != 1 {
		t.Fatalf("rows = %q, want one payment", store.rows)
	}
	if st := c.Stats(); st.Hits != 2 {
		t.Fatalf("Stats = %+v, want 2 replays from the cache", st)
	}
}

// TestTxCachePostgres: the same through pgstore, whose transaction is a
// pgx.Tx.
func TestTxCachePostgres(t *testing.T) {
	t.Parallel()
	s, pool := newPgStore(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE payments (key text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	c := replaycache.NewTx(s)
	h := idempotency.New(c, idempotency.WithTransaction(true))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, _ := idempotency.FromContext(r.Context())
		if _, err := info.Tx.(pgx.Tx).Exec(r.Context(), `INSERT INTO payments (key) VALUES ($1)`, info.Key); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "paid "+info.Key)
	}))
	for i := range 4 {
		status, body, replayed := post(h, "order-1")
		if status != http.StatusCreated || body != "paid order-1" || replayed != (i > 0) {
			t.Fatalf("request %d: %d %q replayed=%v", i, status, body, replayed)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM payments`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d payments, want 1", n)
	}
	if st := c.Stats(); st.Hits != 2 {
		t.Fatalf("Stats = %+v, want 2 replays from the cache", st)
	}
}
