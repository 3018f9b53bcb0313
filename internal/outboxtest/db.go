package outboxtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/pgstore"
)

// DB is a database of its own on the test server, with pgstore's tables
// (records and outbox), a pool on it, a Store and a transactional Runner.
type DB struct {
	URL    string
	Pool   *pgxpool.Pool
	Store  *pgstore.Store
	Runner *idempotency.Runner
}

// NewDB creates a DB for t, dropped when t ends (see pgtest.Database).
// configure adjusts the pool's configuration.
func NewDB(t testing.TB, configure ...func(*pgxpool.Config)) *DB {
	t.Helper()
	url := pgtest.Database(t)
	pool := pgtest.PoolOn(t, url, configure...)
	if err := pgstore.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	s := pgstore.New(pool)
	t.Cleanup(func() { s.Close() })
	return &DB{URL: url, Pool: pool, Store: s, Runner: idempotency.NewRunner(s, idempotency.WithTransaction(true))}
}

// Enqueue runs a transactional call of db's Runner with key (a fresh
// record) that enqueues msgs, and returns their IDs once it committed.
func (db *DB) Enqueue(t testing.TB, key string, msgs ...outbox.Message) []string {
	t.Helper()
	ids, err := db.TryEnqueue(context.Background(), key, msgs...)
	if err != nil {
		t.Fatalf("enqueue under key %s: %v", key, err)
	}
	return ids
}

// TryEnqueue is Enqueue for goroutines other than the test's: it returns
// the call's error.
func (db *DB) TryEnqueue(ctx context.Context, key string, msgs ...outbox.Message) ([]string, error) {
	res, err := idempotency.Do(ctx, db.Runner, idempotency.Call{Name: "enqueue", Key: key}, func(ctx context.Context) ([]string, error) {
		return outbox.Enqueue(ctx, msgs...)
	})
	if err == nil && res.Replayed {
		err = errors.New("outboxtest: the key " + key + " was used before")
	}
	return res.Value, err
}

// Row is a message's row, as the tests look at it.
type Row struct {
	Status    lifecycle.State
	Attempts  int
	LastError *string
	ClaimedBy *string
}

// Row returns the row of the message id, and false when there is none.
func (db *DB) Row(t testing.TB, id string) (Row, bool) {
	t.Helper()
	key, seq, err := outbox.ParseID(id)
	if err != nil {
		t.Fatal(err)
	}
	var r Row
	err = db.Pool.QueryRow(context.Background(),
		`SELECT status, attempts, last_error, claimed_by FROM idempotency_outbox WHERE storage_key = $1 AND seq = $2`, key, seq).
		Scan(&r.Status, &r.Attempts, &r.LastError, &r.ClaimedBy)
	if errors.Is(err, pgx.ErrNoRows) {
		return Row{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return r, true
}

// Statuses counts the outbox's rows by status.
func (db *DB) Statuses(t testing.TB) map[lifecycle.State]int {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT status, count(*) FROM idempotency_outbox GROUP BY status`)
	if err != nil {
		t.Fatal(err)
	}
	m := map[lifecycle.State]int{}
	for rows.Next() {
		var s lifecycle.State
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		m[s] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return m
}

// AwaitAllDone waits until the outbox's rows are all done, for at most d,
// and fails t otherwise. It polls the table: the rows may change in
// another process, whose events the test cannot see.
func (db *DB) AwaitAllDone(t testing.TB, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		st := db.Statuses(t)
		if len(st) == 0 || len(st) == 1 && st[lifecycle.Done] > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("rows not all done after %v: %v", d, st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
