package httpbench

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/benchmarks/internal/sqlitefloor"
	"github.com/go-idempotency/idempotency/benchmarks/load"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/memstore"
	"github.com/go-idempotency/idempotency/pgstore"
	"github.com/go-idempotency/idempotency/redisstore"
	"github.com/go-idempotency/idempotency/replaycache"
	"github.com/go-idempotency/idempotency/sqlitestore"
)

var rounds = flag.Int("rounds", 1, "rounds of every group of sides")

const (
	// reqBody is the body of every request.
	reqBody = `{"amount":"10.00","currency":"EUR"}`
	// ttl outlasts the rounds of every store (SQLite's, the longest, take
	// about ten minutes on two shared cores: a replay must find its
	// records to the end) and keeps what a run leaves behind short-lived.
	ttl = time.Hour
	// replayKeys is how many completed records a replay side reads in turn.
	replayKeys = 256
	// perClient is the least number of requests a side gets per client in
	// a round.
	perClient = 25
)

// clientCounts are the numbers of concurrent clients of every comparison:
// one, which the record-floor targets judge, and 64 on the machine's cores.
var clientCounts = []int{1, 64}

// redisClientCounts are those of the Redis comparisons, which also run
// with 16 clients: the store's calls on a go-redis client at its defaults
// beside one with ContextTimeoutEnabled (see redisstore's callClient).
var redisClientCounts = []int{1, 16, 64}

// A side is one server of a comparison and the client that drives it.
type side struct {
	name     string
	url      string
	client   *http.Client
	replayed bool   // a replay it answers carries Idempotent-Replayed: true
	prefix   string // of its keys, unique to the side
	seq      atomic.Int64
	seeded   bool // its replayed records are stored
}

// newSide returns a side named name that drives the server at base.
func newSide(b *testing.B, name, base string, replayed bool) *side {
	client := load.NewClient(clientCounts[len(clientCounts)-1])
	b.Cleanup(client.CloseIdleConnections)
	var r [6]byte
	_, _ = rand.Read(r[:])
	return &side{name: name, url: base + "/payments", client: client, replayed: replayed, prefix: hex.EncodeToString(r[:]) + "-"}
}

// serve serves h on a loopback port until b ends and returns its base URL.
func serve(b *testing.B, h http.Handler) string {
	srv, err := load.Serve(h)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { srv.Close() })
	return srv.URL
}

// key returns the key of request i of work: one of the replayed records
// in turn, or a fresh one.
func (s *side) key(work string, i int64) string {
	if work == "replay" {
		return s.prefix + strconv.FormatInt(i%replayKeys, 10)
	}
	return s.prefix + "n" + strconv.FormatInt(s.seq.Add(1), 10)
}

// send posts one request of work with key to s and checks the answer. The
// X-Load-Kind header tells a record floor whether the request is a
// duplicate; the middleware ignores it.
func (s *side) send(work, key string) error {
	req, err := http.NewRequest(http.MethodPost, s.url, strings.NewReader(reqBody))
	if err != nil {
		return err
	}
	kind := "new"
	if work == "replay" {
		kind = "dup"
	}
	req.Header["Content-Type"] = []string{"application/json"}
	req.Header["Idempotency-Key"] = []string{key}
	req.Header[load.HeaderKind] = []string{kind}
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	switch {
	case err != nil:
		return err
	case resp.StatusCode != http.StatusCreated:
		return fmt.Errorf("%s, %s %s: status %d", s.name, work, key, resp.StatusCode)
	case kind == "dup" && s.replayed && resp.Header.Get(idempotency.HeaderReplayed) != "true":
		return fmt.Errorf("%s, %s %s: not a replay", s.name, work, key)
	}
	return nil
}

// run sends n requests of work to s from clients goroutines and returns the
// first error.
func (s *side) run(work string, clients int, n int64) error {
	var next atomic.Int64
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < n; i = next.Add(1) - 1 {
				if err := s.send(work, s.key(work, i)); err != nil {
					mu.Lock()
					first = cmp.Or(first, err)
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// A group is the sides that one comparison measures: the same work
// ("replay", "first" or "tx") with the same number of clients.
type group struct {
	label   string // the benchmark name's part before side=
	work    string
	clients int
	sides   []*side
}

// groups returns a group per number of clients (clientCounts) and work,
// whose sides sidesOf gives, labelled after prefix.
func groups(prefix string, sidesOf func(work string) []*side, works ...string) []*group {
	return groupsFor(clientCounts, prefix, sidesOf, works...)
}

// groupsFor is groups with the client counts counts.
func groupsFor(counts []int, prefix string, sidesOf func(work string) []*side, works ...string) []*group {
	var gs []*group
	for _, clients := range counts {
		for _, w := range works {
			gs = append(gs, &group{label: fmt.Sprintf("%swork=%s/clients=%d", prefix, w, clients), work: w, clients: clients, sides: sidesOf(w)})
		}
	}
	return gs
}

// prepare completes the records the replays of g read, waiting until each
// replays (the middleware answers before it stores a record), then warms
// every side up: its connections and, on PostgreSQL, the statements each
// connection prepares.
func (g *group) prepare() error {
	for _, s := range g.sides {
		if g.work == "replay" && !s.seeded {
			s.seeded = true
			for i := range int64(replayKeys) {
				if err := s.send("first", s.key("replay", i)); err != nil {
					return err
				}
			}
			deadline := time.Now().Add(10 * time.Second)
			for i := range int64(replayKeys) {
				for err := s.send("replay", s.key("replay", i)); err != nil; err = s.send("replay", s.key("replay", i)) {
					if time.Now().After(deadline) {
						return err
					}
					time.Sleep(time.Millisecond)
				}
			}
		}
		if err := s.run(g.work, g.clients, int64(4*g.clients+100)); err != nil {
			return err
		}
	}
	return nil
}

// measure prepares every group, then runs -rounds rounds of them as
// sub-benchmarks round=N/<label>/side=<name>, each side once a round (b.N
// requests, or perClient per client if that is more), the sides of a group
// in an order that rotates from round to round. ns/op is the wall time per
// request: the inverse of throughput. Many short rounds pair the sides of
// a group more closely in time than a few long ones.
func measure(b *testing.B, gs []*group) {
	for _, g := range gs {
		if err := g.prepare(); err != nil {
			b.Fatalf("%s: %v", g.label, err)
		}
	}
	for r := range *rounds {
		b.Run(fmt.Sprintf("round=%d", r+1), func(b *testing.B) {
			for _, g := range gs {
				for j := range g.sides {
					s := g.sides[(j+r)%len(g.sides)]
					b.Run(g.label+"/side="+s.name, func(b *testing.B) {
						// Many clients need a few dozen requests each, or
						// their start and end would be much of the time.
						n := max(b.N, perClient*g.clients)
						start := time.Now()
						if err := s.run(g.work, g.clients, int64(n)); err != nil {
							b.Fatal(err)
						}
						b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(n), "ns/op")
					})
				}
			}
		})
	}
}

// BenchmarkHTTP puts the middleware on each store beside the record floor
// of the same work (see floors_test.go), for replays and first executions
// and, on PostgreSQL and SQLite, for a transactional route beside the
// transactional record floor. Sides: mw (the middleware), floor (the
// record floor), bare (the handler alone; on the transactional route, the
// handler writing its row in a transaction of its own), on memstore's
// replays cached (the middleware with a replaycache in front of memstore),
// on Redis timeout (the middleware on a go-redis client with
// ContextTimeoutEnabled; mw keeps go-redis's defaults) and, on SQLite,
// memstore and postgres (the middleware on those stores, so that the
// same requests meet them in the same rounds as SQLite's sides). Bodies
// are 1 KiB.
func BenchmarkHTTP(b *testing.B) {
	payload := load.Payload(1 << 10)
	b.Run("store=memstore", func(b *testing.B) {
		ms := memstore.New(memstore.WithMaxEntries(1<<26), memstore.WithMaxBytes(1<<40))
		b.Cleanup(func() { ms.Close() })
		mw := newSide(b, "mw", serve(b, idempotency.New(ms, idempotency.WithTTL(ttl))(load.Handler(payload))), true)
		cached := newSide(b, "cached", serve(b, idempotency.New(replaycache.New(ms), idempotency.WithTTL(ttl))(load.Handler(payload))), true)
		floor := newSide(b, "floor", serve(b, newMemFloor().handler(payload)), false)
		bare := newSide(b, "bare", serve(b, load.Handler(payload)), false)
		measure(b, groups("", func(work string) []*side {
			if work == "replay" {
				return []*side{floor, mw, bare, cached}
			}
			return []*side{floor, mw, bare}
		}, "replay", "first"))
	})
	b.Run("store=redis", func(b *testing.B) {
		c := redis.NewClient(&redis.Options{Addr: redistest.Addr(b), PoolSize: 128})
		b.Cleanup(func() { c.Close() })
		prefix := redistest.Prefix()
		if os.Getenv(redistest.AddrEnv) != "" {
			b.Cleanup(func() { deleteKeys(c, prefix) })
		}
		rs := redisstore.New(c, redisstore.WithPrefix(prefix))
		b.Cleanup(func() { rs.Close() })
		// timeout is the store on a client that honours deadlines itself,
		// as redisstore's README recommends: the store then needs no
		// goroutine of its own to bound a call.
		tc := redis.NewClient(&redis.Options{Addr: c.Options().Addr, PoolSize: 128, ContextTimeoutEnabled: true})
		b.Cleanup(func() { tc.Close() })
		ts := redisstore.New(tc, redisstore.WithPrefix(prefix+"timeout:"))
		b.Cleanup(func() { ts.Close() })
		mw := newSide(b, "mw", serve(b, idempotency.New(rs, idempotency.WithTTL(ttl))(load.Handler(payload))), true)
		timeout := newSide(b, "timeout", serve(b, idempotency.New(ts, idempotency.WithTTL(ttl))(load.Handler(payload))), true)
		floor := newSide(b, "floor", serve(b, load.RecordFloorHandler(c, prefix+"floor:", payload, ttl)), false)
		measure(b, groupsFor(redisClientCounts, "", func(string) []*side { return []*side{floor, mw, timeout} }, "replay", "first"))
	})
	b.Run("store=postgres", func(b *testing.B) {
		pool := pgtest.Pool(b, func(c *pgxpool.Config) { c.MaxConns = 32 })
		f, err := newPGFloor(pool, payload)
		if err != nil {
			b.Fatal(err)
		}
		ps := pgstore.New(pool)
		b.Cleanup(func() { ps.Close() })
		mw := newSide(b, "mw", serve(b, idempotency.New(ps, idempotency.WithTTL(ttl))(load.Handler(payload))), true)
		floor := newSide(b, "floor", serve(b, f.handler()), false)
		txMW := newSide(b, "mw", serve(b, idempotency.New(ps, idempotency.WithTTL(ttl), idempotency.WithTransaction(true))(f.payHandler())), true)
		txFloor := newSide(b, "floor", serve(b, f.txHandler()), false)
		txBare := newSide(b, "bare", serve(b, f.ownTxHandler()), false)
		measure(b, groups("", func(work string) []*side {
			if work == "tx" {
				return []*side{txFloor, txMW, txBare}
			}
			return []*side{floor, mw}
		}, "replay", "first", "tx"))
	})
	b.Run("store=sqlite", func(b *testing.B) {
		dir := b.TempDir()
		ss, err := sqlitestore.Open(filepath.Join(dir, "records.db"))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { ss.Close() })
		if _, err := ss.DB().Exec(sqlitefloor.PaymentsSQL); err != nil {
			b.Fatal(err)
		}
		// The floor's file has the store's settings and table: Open makes
		// it, and the floor writes to it through the *sql.DB alone.
		fs, err := sqlitestore.Open(filepath.Join(dir, "floor.db"))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { fs.Close() })
		f, err := newSQLiteFloor(fs.DB(), payload)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(f.Close)
		mw := newSide(b, "mw", serve(b, idempotency.New(ss, idempotency.WithTTL(ttl))(load.Handler(payload))), true)
		floor := newSide(b, "floor", serve(b, f.handler()), false)
		txMW := newSide(b, "mw", serve(b, idempotency.New(ss, idempotency.WithTTL(ttl), idempotency.WithTransaction(true))(sqlitePayHandler(payload))), true)
		txFloor := newSide(b, "floor", serve(b, f.txHandler()), false)
		// The middleware on memstore and on PostgreSQL, for the same
		// requests in the same rounds; PostgreSQL's sides only with a
		// server.
		ms := memstore.New(memstore.WithMaxEntries(1<<26), memstore.WithMaxBytes(1<<40))
		b.Cleanup(func() { ms.Close() })
		mem := newSide(b, "memstore", serve(b, idempotency.New(ms, idempotency.WithTTL(ttl))(load.Handler(payload))), true)
		var pg, txPG []*side
		if pgAvailable() {
			pool := pgtest.Pool(b, func(c *pgxpool.Config) { c.MaxConns = 32 })
			pf, err := newPGFloor(pool, payload)
			if err != nil {
				b.Fatal(err)
			}
			ps := pgstore.New(pool)
			b.Cleanup(func() { ps.Close() })
			pg = []*side{newSide(b, "postgres", serve(b, idempotency.New(ps, idempotency.WithTTL(ttl))(load.Handler(payload))), true)}
			txPG = []*side{newSide(b, "postgres", serve(b, idempotency.New(ps, idempotency.WithTTL(ttl), idempotency.WithTransaction(true))(pf.payHandler())), true)}
		}
		measure(b, groups("", func(work string) []*side {
			if work == "tx" {
				return append([]*side{txFloor, txMW}, txPG...)
			}
			return append([]*side{floor, mw, mem}, pg...)
		}, "replay", "first", "tx"))
	})
}

// pgAvailable reports whether the PostgreSQL server of internal/pgtest
// answers, or is required (pgtest then fails the benchmark without it).
func pgAvailable() bool {
	if os.Getenv(pgtest.RequireEnv) == "1" {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, pgtest.ServerURL())
	if err != nil {
		return false
	}
	c.Close(ctx)
	return true
}

// deleteKeys removes the keys under prefix from a server the benchmark
// did not start.
func deleteKeys(c *redis.Client, prefix string) {
	ctx := context.Background()
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		c.Unlink(ctx, iter.Val())
	}
}
