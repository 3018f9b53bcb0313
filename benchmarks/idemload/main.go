// Command idemload measures the idempotency middleware over loopback HTTP.
//
// It starts an HTTP server on 127.0.0.1 whose handler answers 201 with a
// body of -body bytes, wrapped in the middleware over memstore or, with
// -redis, over Redis, and drives it for -duration with -concurrency clients
// sending a mix of requests (-mix): new (a fresh key: first execution), dup
// (the key of a completed request: replay) and concdup (two requests with
// one fresh key at once: one runs, the other gets 409 or a replay).
//
// In the same run it measures the bare handler (the same server without the
// middleware) and, for Redis, the record floor (recordfloor): the bare
// handler with the least a store keeping its records in Redis hashes does
// (a first execution creates a hash with its expiry, then stores the
// payload in it; a duplicate reads the payload back), checking nothing. It
// prints a progress line every second, then throughput, p50/p99 latency and
// the middleware's ratio to each.
//
//	idemload -duration 5s -concurrency 16 -mix new=70,dup=20,concdup=10 -body 1024
//	idemload -redis auto          # a private redis-server, stopped at exit
//	idemload -redis 127.0.0.1:6379
//
// Everything stays on loopback: a -redis address outside it is refused.
// Records written to a given Redis server live under a fresh key prefix
// and are deleted at exit.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/benchmarks/load"
	"github.com/go-idempotency/idempotency/memstore"
	"github.com/go-idempotency/idempotency/redisstore"
	"github.com/redis/go-redis/v9"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

type options struct {
	duration    time.Duration
	concurrency int
	mix         load.Mix
	body        int
	redis       string
	rounds      int
	warm        int
	cpuprofile  string
}

func parse(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("idemload", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	var mix string
	fs.DurationVar(&o.duration, "duration", 5*time.Second, "measured time per target and round (at most 10m)")
	fs.IntVar(&o.concurrency, "concurrency", 16, "concurrent clients (1..4096)")
	fs.StringVar(&mix, "mix", "new=70,dup=20,concdup=10", "request mix: weights of new, dup and concdup")
	fs.IntVar(&o.body, "body", 1024, "response body size in bytes (0..1048576)")
	fs.StringVar(&o.redis, "redis", "", `Redis store: "" for memstore, "auto" for a private redis-server, or a loopback host:port`)
	fs.IntVar(&o.rounds, "rounds", 1, "rounds of (bare, record floor, middleware); the median round is reported (1..20)")
	fs.IntVar(&o.warm, "warm", 1000, "requests sent before each measurement, whose keys dup requests repeat (1..100000)")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of the first round's middleware measurement (client and server) to this file")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	var err error
	if o.mix, err = load.ParseMix(mix); err != nil {
		return o, err
	}
	switch {
	case o.duration <= 0 || o.duration > 10*time.Minute:
		return o, fmt.Errorf("-duration %v: want 0 < d <= 10m", o.duration)
	case o.concurrency < 1 || o.concurrency > 4096:
		return o, fmt.Errorf("-concurrency %d: want 1..4096", o.concurrency)
	case o.body < 0 || o.body > 1<<20:
		return o, fmt.Errorf("-body %d: want 0..1048576", o.body)
	case o.rounds < 1 || o.rounds > 20:
		return o, fmt.Errorf("-rounds %d: want 1..20", o.rounds)
	case o.warm < 1 || o.warm > 100_000:
		return o, fmt.Errorf("-warm %d: want 1..100000", o.warm)
	case o.redis != "" && o.redis != "auto" && !load.Loopback(o.redis):
		return o, fmt.Errorf("-redis %q: only loopback addresses (127.0.0.1, ::1, localhost) are allowed", o.redis)
	}
	return o, nil
}

func run(args []string, stdout, stderr io.Writer) int {
	o, err := parse(args, stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "idemload:", err)
		}
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := measure(ctx, o, stdout); err != nil {
		fmt.Fprintln(stderr, "idemload:", err)
		return 1
	}
	return 0
}

// target is one server shape to measure.
type target struct {
	name    string
	handler http.Handler
	results []*load.Result
}

func measure(ctx context.Context, o options, out io.Writer) error {
	payload := load.Payload(o.body)
	storeName := "memstore"
	var store idempotency.Store
	var targets []*target
	targets = append(targets, &target{name: "bare", handler: load.Handler(payload)})

	if o.redis == "" {
		ms := memstore.New(memstore.WithMaxEntries(1<<26), memstore.WithMaxBytes(1<<40))
		defer ms.Close()
		store = ms
	} else {
		addr := o.redis
		if addr == "auto" {
			srv, err := load.StartRedis()
			if err != nil {
				return err
			}
			defer srv.Stop()
			addr = srv.Addr
		}
		client := redis.NewClient(&redis.Options{Addr: addr, PoolSize: max(2*o.concurrency, 10*runtime.GOMAXPROCS(0))})
		defer client.Close()
		if err := client.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("redis at %s: %w", addr, err)
		}
		var b [8]byte
		_, _ = rand.Read(b[:])
		prefix := "idemload:" + hex.EncodeToString(b[:]) + ":"
		rs := redisstore.New(client, redisstore.WithPrefix(prefix))
		defer rs.Close()
		defer deleteKeys(client, prefix)
		store = rs
		storeName = "redis " + load.RedisVersion(ctx, client) + " at " + addr
		targets = append(targets, &target{name: "recordfloor", handler: load.RecordFloorHandler(client, prefix+"recordfloor:", payload, 10*time.Minute)})
	}
	// A TTL of minutes keeps what a run leaves behind short-lived.
	mw := idempotency.New(store, idempotency.WithTTL(10*time.Minute))
	targets = append(targets, &target{name: "middleware", handler: mw(load.Handler(payload))})

	fmt.Fprintf(out, "idemload: store=%s mix=%s body=%d concurrency=%d duration=%v rounds=%d GOMAXPROCS=%d %s\n",
		storeName, o.mix, o.body, o.concurrency, o.duration, o.rounds, runtime.GOMAXPROCS(0), runtime.Version())
	client := load.NewClient(2 * o.concurrency)
	defer client.CloseIdleConnections()
	for round := 1; round <= o.rounds; round++ {
		for _, t := range targets {
			srv, err := load.Serve(t.handler)
			if err != nil {
				return err
			}
			stopProfile := func() {}
			if o.cpuprofile != "" && t == targets[len(targets)-1] && round == 1 {
				if stopProfile, err = startCPUProfile(o.cpuprofile); err != nil {
					srv.Close()
					return err
				}
			}
			name := t.name
			if o.rounds > 1 {
				name = fmt.Sprintf("%s #%d", t.name, round)
			}
			res, err := load.Run(ctx, client, load.Config{
				URL: srv.URL, Duration: o.duration, Concurrency: o.concurrency, Mix: o.mix, Warm: o.warm,
				Progress: func(done int64, elapsed time.Duration) {
					fmt.Fprintf(out, "  [%-13s] %5.1fs %9d req %9.0f req/s\n", name, elapsed.Seconds(), done, float64(done)/elapsed.Seconds())
				},
			})
			stopProfile()
			client.CloseIdleConnections()
			srv.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", t.name, err)
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			t.results = append(t.results, res)
		}
	}
	report(out, targets)
	return nil
}

// ratioOf returns the median over rounds of a's throughput relative to b's
// in the same round.
func ratioOf(a, b *target) float64 {
	rs := make([]float64, 0, len(a.results))
	for i := range a.results {
		if bt := b.results[i].Throughput(); bt > 0 {
			rs = append(rs, a.results[i].Throughput()/bt)
		}
	}
	if len(rs) == 0 {
		return 0
	}
	slices.Sort(rs)
	return rs[len(rs)/2]
}

// latencyRatioOf returns the median over rounds of a's p50 (pct 50) or p99
// latency relative to b's in the same round.
func latencyRatioOf(a, b *target, pct int) float64 {
	pick := func(r *load.Result) time.Duration {
		if pct == 50 {
			return r.Latency.P50
		}
		return r.Latency.P99
	}
	rs := make([]float64, 0, len(a.results))
	for i := range a.results {
		if bl := pick(b.results[i]); bl > 0 {
			rs = append(rs, float64(pick(a.results[i]))/float64(bl))
		}
	}
	if len(rs) == 0 {
		return 0
	}
	slices.Sort(rs)
	return rs[len(rs)/2]
}

// median returns the result of median throughput.
func median(rs []*load.Result) *load.Result {
	s := slices.Clone(rs)
	sort.Slice(s, func(i, j int) bool { return s[i].Throughput() < s[j].Throughput() })
	return s[len(s)/2]
}

func report(out io.Writer, targets []*target) {
	fmt.Fprintln(out)
	fmt.Fprintf(out, "%-11s %10s %9s %9s %8s  %s\n", "target", "req/s", "p50", "p99", "errors", "middleware throughput ratio")
	last := targets[len(targets)-1]
	var mw *load.Result
	for _, t := range targets {
		r := median(t.results)
		ratio := ""
		if t == last {
			mw = r
			var parts []string
			for _, b := range targets[:len(targets)-1] {
				parts = append(parts, fmt.Sprintf("%.2fx %s", ratioOf(last, b), b.name))
			}
			ratio = strings.Join(parts, ", ")
		}
		errs := int64(0)
		for _, r := range t.results {
			errs += r.Errors
		}
		fmt.Fprintf(out, "%-11s %10.0f %9s %9s %8d  %s\n", t.name, r.Throughput(), round(r.Latency.P50), round(r.Latency.P99), errs, ratio)
	}
	if len(last.results) > 1 {
		fmt.Fprintf(out, "(median of %d rounds; a ratio is the median of the rounds' ratios)\n", len(last.results))
	}
	var lat []string
	for _, b := range targets[:len(targets)-1] {
		lat = append(lat, fmt.Sprintf("%.2fx/%.2fx %s", latencyRatioOf(last, b, 50), latencyRatioOf(last, b, 99), b.name))
	}
	fmt.Fprintf(out, "middleware latency ratio p50/p99: %s\n", strings.Join(lat, ", "))
	if mw == nil {
		return
	}
	fmt.Fprintln(out)
	fmt.Fprintln(out, "middleware by kind:")
	for k := load.New; k <= load.ConcDup; k++ {
		l := mw.ByKind[k]
		if l.N == 0 {
			continue
		}
		fmt.Fprintf(out, "  %-8s %9d req %9d replayed  p50 %9s  p99 %9s\n", k, l.N, mw.Replayed[k], round(l.P50), round(l.P99))
	}
	codes := make([]int, 0, len(mw.Status))
	for c := range mw.Status {
		codes = append(codes, c)
	}
	slices.Sort(codes)
	var parts []string
	for _, c := range codes {
		parts = append(parts, fmt.Sprintf("%d: %d", c, mw.Status[c]))
	}
	fmt.Fprintf(out, "  statuses %s\n", strings.Join(parts, ", "))
	if mw.FirstError != nil {
		fmt.Fprintf(out, "  first error: %v\n", mw.FirstError)
	}
}

func round(d time.Duration) string {
	switch {
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	case d >= time.Microsecond:
		return d.Round(100 * time.Nanosecond).String()
	}
	return d.String()
}

// startCPUProfile starts a CPU profile into path and returns the function
// that stops it.
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// deleteKeys removes the keys under prefix that a run left in Redis.
func deleteKeys(c *redis.Client, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	batch := make([]string, 0, 1000)
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == cap(batch) {
			c.Unlink(ctx, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		c.Unlink(ctx, batch...)
	}
}
