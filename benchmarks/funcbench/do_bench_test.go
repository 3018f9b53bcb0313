package funcbench

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/benchmarks/load"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/memstore"
	"github.com/go-idempotency/idempotency/pgstore"
	"github.com/go-idempotency/idempotency/redisstore"
)

// receipt is the function's result: about 1 KiB of JSON, as the HTTP
// benchmarks' bodies are.
type receipt struct {
	ID   string `json:"id"`
	Note string `json:"note"`
}

var (
	result  = receipt{ID: "ch_1", Note: string(bytes.Repeat([]byte("n"), 1000))}
	payload = []byte(`{"amount":"10.00","currency":"EUR"}`)
	ttl     = 10 * time.Minute
)

func charge(context.Context) (receipt, error) { return result, nil }

// floor is a store's record floor for functions: begin creates a key's
// record, done stores the encoded result in it, read returns it.
type floor interface {
	begin(ctx context.Context, key string) error
	done(ctx context.Context, key string, body []byte) error
	read(ctx context.Context, key string) ([]byte, error)
}

// BenchmarkDo measures a first execution and a replay through Do beside
// the same work done by hand on each store's record floor, and the bare
// function.
func BenchmarkDo(b *testing.B) {
	b.Run("Bare", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := charge(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("memstore", func(b *testing.B) {
		s := memstore.New(memstore.WithMaxEntries(1<<26), memstore.WithMaxBytes(1<<40))
		b.Cleanup(func() { s.Close() })
		pair(b, s, &memFloor{records: map[string][]byte{}})
	})
	b.Run("redis", func(b *testing.B) {
		c := redis.NewClient(&redis.Options{Addr: redistest.Addr(b)})
		b.Cleanup(func() { c.Close() })
		s := redisstore.New(c, redisstore.WithPrefix("funcbench:"))
		b.Cleanup(func() { s.Close() })
		pair(b, s, &redisFloor{c: c})
	})
	b.Run("postgres", func(b *testing.B) {
		pool := pgtest.Pool(b, func(c *pgxpool.Config) { c.MaxConns = 4 })
		if err := load.MigrateFloor(context.Background(), pool); err != nil {
			b.Fatal(err)
		}
		s := pgstore.New(pool)
		b.Cleanup(func() { s.Close() })
		pair(b, s, &pgFloor{pool: pool})
	})
}

// pair runs the first execution and the replay through Do on s and by hand
// on f.
func pair(b *testing.B, s idempotency.Store, f floor) {
	ctx := context.Background()
	r := idempotency.NewRunner(s, idempotency.WithTTL(ttl))
	var seq int
	next := func(prefix string) string { seq++; return prefix + strconv.Itoa(seq) }
	call := func(key string) idempotency.Call { return idempotency.Call{Name: "charge", Key: key, Payload: payload} }
	b.Run("FirstExecution", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := idempotency.Do(ctx, r, call(next("do-")), charge); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("FirstExecutionFloor", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			key := next("floor-")
			if err := f.begin(ctx, key); err != nil {
				b.Fatal(err)
			}
			v, _ := charge(ctx)
			body, _ := json.Marshal(v)
			if err := f.done(ctx, key, body); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Replay", func(b *testing.B) {
		key := next("do-replayed-")
		if _, err := idempotency.Do(ctx, r, call(key), charge); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if res, err := idempotency.Do(ctx, r, call(key), charge); err != nil || !res.Replayed {
				b.Fatal(res, err)
			}
		}
	})
	b.Run("ReplayFloor", func(b *testing.B) {
		key := next("floor-replayed-")
		body, _ := json.Marshal(result)
		if err := f.begin(ctx, key); err != nil {
			b.Fatal(err)
		}
		if err := f.done(ctx, key, body); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			stored, err := f.read(ctx, key)
			if err != nil {
				b.Fatal(err)
			}
			var v receipt
			if err := json.Unmarshal(stored, &v); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// memFloor is the record floor of an in-process store: a map under one
// lock, whose records keep their own copy of the result.
type memFloor struct {
	mu      sync.Mutex
	records map[string][]byte
}

func (f *memFloor) begin(_ context.Context, key string) error {
	f.mu.Lock()
	f.records[key] = nil
	f.mu.Unlock()
	return nil
}

func (f *memFloor) done(_ context.Context, key string, body []byte) error {
	body = bytes.Clone(body)
	f.mu.Lock()
	f.records[key] = body
	f.mu.Unlock()
	return nil
}

func (f *memFloor) read(_ context.Context, key string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.records[key], nil
}

// redisFloor is the record floor of Redis hashes (load's scripts).
type redisFloor struct{ c *redis.Client }

var meta = bytes.Repeat([]byte("m"), 40) // the size of the status-and-headers block redisstore keeps

func (f *redisFloor) begin(ctx context.Context, key string) error {
	return load.RecordNewScript.Run(ctx, f.c, []string{"funcbench-floor:" + key}, ttl.Milliseconds()).Err()
}

func (f *redisFloor) done(ctx context.Context, key string, body []byte) error {
	return load.RecordDoneScript.Run(ctx, f.c, []string{"funcbench-floor:" + key}, ttl.Milliseconds(), meta, body).Err()
}

func (f *redisFloor) read(ctx context.Context, key string) ([]byte, error) {
	v, err := load.RecordReadScript.Run(ctx, f.c, []string{"funcbench-floor:" + key}).Slice()
	if err != nil || len(v) != 2 {
		return nil, err
	}
	s, _ := v[1].(string)
	return []byte(s), nil
}

// pgFloor is the record floor of PostgreSQL (load's statements).
type pgFloor struct {
	pool  *pgxpool.Pool
	token int
}

func (f *pgFloor) begin(ctx context.Context, key string) error {
	f.token++
	_, err := f.pool.Exec(ctx, load.RecordNewSQL, key, strconv.Itoa(f.token), []byte("fingerprint"), time.Minute, ttl)
	return err
}

func (f *pgFloor) done(ctx context.Context, key string, body []byte) error {
	_, err := f.pool.Exec(ctx, load.RecordDoneSQL, key, int32(200), meta, body, ttl)
	return err
}

func (f *pgFloor) read(ctx context.Context, key string) ([]byte, error) {
	var status int32
	var header, body []byte
	err := f.pool.QueryRow(ctx, load.RecordReadSQL, key).Scan(&status, &header, &body)
	return body, err
}
