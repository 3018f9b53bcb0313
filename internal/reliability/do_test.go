package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/pgstore"
)

// TestDoConcurrentDuplicates: many callers of Do per key at once, on every
// store, in wait mode, with a function that fails now and then (its key is
// released, and a caller retries): each key's function succeeds once, and
// every caller ends with that one result. On PostgreSQL the function writes
// a row in the call's transaction, and each key holds exactly one row.
func TestDoConcurrentDuplicates(t *testing.T) {
	const (
		keys    = 20
		callers = 10
	)
	run := func(t *testing.T, name string, s idempotency.Store, pool *pgxpool.Pool) {
		tx := pool != nil
		opts := []idempotency.RunnerOption{idempotency.WithWait(10 * time.Second), idempotency.WithLease(5 * time.Second)}
		if tx {
			opts = append(opts, idempotency.WithTransaction(true))
		}
		r := idempotency.NewRunner(s, opts...)
		var mu sync.Mutex
		succeeded := map[string]int{}
		var attempts, calls atomic.Int64
		fn := func(key string) func(ctx context.Context) (string, error) {
			return func(ctx context.Context) (string, error) {
				n := attempts.Add(1)
				if n%7 == 0 {
					return "", errors.New("transient failure")
				}
				if tx {
					t, _ := pgstore.TxFromContext(ctx)
					if _, err := t.Exec(ctx, `INSERT INTO effects (key) VALUES ($1)`, key); err != nil {
						return "", err
					}
				}
				mu.Lock()
				succeeded[key]++
				mu.Unlock()
				return fmt.Sprint("result-", n), nil
			}
		}
		results := make([][]string, keys)
		for i := range results {
			results[i] = make([]string, callers)
		}
		var wg sync.WaitGroup
		for k := range keys {
			for c := range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					key := fmt.Sprint("k", k)
					for {
						calls.Add(1)
						res, err := idempotency.Do(context.Background(), r, idempotency.Call{Name: "apply", Key: key, Payload: []byte(key)}, fn(key))
						if err == nil {
							results[k][c] = res.Value
							return
						}
						if !errors.Is(err, idempotency.ErrInFlight) && err.Error() != "transient failure" {
							t.Errorf("%s: %v", key, err)
							return
						}
					}
				}()
			}
		}
		wg.Wait()
		var violations int64
		for k := range keys {
			key := fmt.Sprint("k", k)
			if succeeded[key] != 1 {
				t.Errorf("%s: the function succeeded %d times", key, succeeded[key])
				violations++
			}
			for c := 1; c < callers; c++ {
				if results[k][c] != results[k][0] {
					t.Errorf("%s: callers got %q and %q", key, results[k][0], results[k][c])
					violations++
				}
			}
		}
		if tx {
			rows := effectRows(t, pool)
			for k := range keys {
				if key := fmt.Sprint("k", k); rows[key] != 1 {
					t.Errorf("%s: %d rows", key, rows[key])
					violations++
				}
			}
		}
		reliability.Report(t, reliability.Result{Scenario: "functions: concurrent duplicates and failures run once", Store: name,
			Operations: calls.Load(), Violations: violations,
			Note: fmt.Sprintf("%d keys × %d callers, %d attempts of the function", keys, callers, attempts.Load())})
	}
	t.Run("memstore", func(t *testing.T) { run(t, "memstore", newMemstore(t), nil) })
	t.Run("redis", func(t *testing.T) { run(t, "redis", newRedisStore(t, fastClient(t, redistest.Addr(t))), nil) })
	t.Run("postgres", func(t *testing.T) {
		pool := pgtest.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 16 })
		ctx := context.Background()
		if err := pgstore.Migrate(ctx, pool); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `CREATE TABLE effects (key text NOT NULL)`); err != nil { // no unique key: a second row would show
			t.Fatal(err)
		}
		s := pgstore.New(pool)
		t.Cleanup(func() { s.Close() })
		run(t, "postgres", s, pool)
	})
}

// effectRows counts the rows of the effects table by key.
func effectRows(t *testing.T, pool *pgxpool.Pool) map[string]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT key, count(*) FROM effects GROUP BY key`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			t.Fatal(err)
		}
		out[k] = n
	}
	return out
}
