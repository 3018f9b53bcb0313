package redisbench

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/benchmarks/load"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/redisstore"
	"github.com/redis/go-redis/v9"
)

// discardWriter is a reusable http.ResponseWriter that discards the body.
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) WriteHeader(code int)        { w.status = code }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) reset()                      { clear(w.h); w.status = 0 }

type rewindBody struct{ bytes.Reader }

func (*rewindBody) Close() error { return nil }

// redisBenchCase prepares a handler and the key (and kind) of request i.
type redisBenchCase struct {
	name   string
	status int // the status every measured request must get
	setup  func(b *testing.B, env *redisBenchEnv, n int) (http.Handler, func(i int) (key []string, kind string))
}

type redisBenchEnv struct {
	client  *redis.Client
	store   *redisstore.Store
	payload []byte
}

func (env *redisBenchEnv) mw(opts ...idempotency.Option) func(http.Handler) http.Handler {
	// Records outlive the benchmark only briefly on a shared server.
	return idempotency.New(env.store, append([]idempotency.Option{idempotency.WithTTL(5 * time.Minute)}, opts...)...)
}

var reqBody = []byte(`{"amount":"10.00","currency":"EUR"}`)

func serveOne(h http.Handler, key []string, body []byte) int {
	r, _ := http.NewRequest(http.MethodPost, "http://example.com/payments", bytes.NewReader(body))
	r.Header["Idempotency-Key"] = key
	w := &discardWriter{h: http.Header{}}
	h.ServeHTTP(w, r)
	return w.status
}

func noKey(int) ([]string, string) { return nil, "new" }

var redisBenchCases = []redisBenchCase{
	{"Bare", http.StatusCreated, func(b *testing.B, env *redisBenchEnv, n int) (http.Handler, func(int) ([]string, string)) {
		return load.Handler(env.payload), noKey
	}},
	// Floor1 is one raw EVALSHA round trip and the handler's write: what a
	// replay or a conflict costs at best.
	{"Floor1", http.StatusCreated, func(b *testing.B, env *redisBenchEnv, n int) (http.Handler, func(int) ([]string, string)) {
		return load.FloorHandler(env.client, env.payload), func(int) ([]string, string) { return nil, "dup" }
	}},
	// Floor2 is the bare handler between two raw EVALSHA round trips: what
	// a first execution costs at best.
	{"Floor2", http.StatusCreated, func(b *testing.B, env *redisBenchEnv, n int) (http.Handler, func(int) ([]string, string)) {
		return load.FloorHandler(env.client, env.payload), noKey
	}},
	// Record1 and Record2 are the floor of any store that keeps records in
	// Redis hashes: Record1 is one EVALSHA that reads a stored payload and
	// writes it as the response; Record2 is the handler between one EVALSHA
	// creating a record and one storing the payload in it, each with an
	// expiry. Neither checks anything: the gap between them and Floor1/2 is
	// the price of reading and writing a record at all.
	{"Record1", http.StatusCreated, func(b *testing.B, env *redisBenchEnv, n int) (http.Handler, func(int) ([]string, string)) {
		key := redistest.Prefix() + "record1"
		if err := load.RecordDoneScript.Run(ctx, env.client, []string{key}, "300000", "meta", env.payload).Err(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { env.client.Del(ctx, key) })
		return recordFloor(env, func(*http.Request) string { return key }), func(int) ([]string, string) { return nil, "dup" }
	}},
	{"Record2", http.StatusCreated, func(b *testing.B, env *redisBenchEnv, n int) (http.Handler, func(int) ([]string, string)) {
		prefix := redistest.Prefix()
		var seq atomic.Int64
		b.Cleanup(func() { cleanPrefix(env.client, prefix) })
		return recordFloor(env, func(*http.Request) string { return prefix + strconv.FormatInt(seq.Add(1), 10) }), noKey
	}},
	// Store1 and Store2 call the store's own Acquire (and Complete) around
	// the handler, as the middleware does, without the middleware: no key
	// parsing, fingerprint, recorder or heartbeat. The gap between them and
	// the record floors is the price of the store's checks (its scripts'
	// extra work and its Go side); the gap between them and Replay or
	// FirstExecution is the middleware's own work.
	{"Store1", http.StatusCreated, func(b *testing.B, env *redisBenchEnv, n int) (http.Handler, func(int) ([]string, string)) {
		key := redistest.Prefix() + "store1"
		if _, err := env.store.Acquire(ctx, storeReq(key, "t0")); err != nil {
			b.Fatal(err)
		}
		if err := env.store.Complete(ctx, key, "t0", storeResponse(env.payload), 5*time.Minute); err != nil {
			b.Fatal(err)
		}
		return storeAlone(env, func() string { return key }), func(int) ([]string, string) { return nil, "dup" }
	}},
	{"Store2", http.StatusCreated, func(b *testing.B, env *redisBenchEnv, n int) (http.Handler, func(int) ([]string, string)) {
		prefix := redistest.Prefix()
		var seq atomic.Int64
		return storeAlone(env, func() string { return prefix + strconv.FormatInt(seq.Add(1), 10) }), noKey
	}},
	{"FirstExecution", http.StatusCreated, func(b *testing.B, env *redisBenchEnv, n int) (http.Handler, func(int) ([]string, string)) {
		keys := make([][]string, n)
		prefix := redistest.Prefix()
		for i := range keys {
			keys[i] = []string{prefix + strconv.Itoa(i)}
		}
		return env.mw()(load.Handler(env.payload)), func(i int) ([]string, string) { return keys[i], "new" }
	}},
	{"Replay", http.StatusCreated, func(b *testing.B, env *redisBenchEnv, n int) (http.Handler, func(int) ([]string, string)) {
		h := env.mw()(load.Handler(env.payload))
		key := []string{redistest.Prefix()}
		if st := serveOne(h, key, reqBody); st != http.StatusCreated {
			b.Fatalf("first request: %d", st)
		}
		return h, func(int) ([]string, string) { return key, "dup" }
	}},
	{"Conflict", http.StatusConflict, func(b *testing.B, env *redisBenchEnv, n int) (http.Handler, func(int) ([]string, string)) {
		held, entered := make(chan struct{}), make(chan struct{})
		slow := env.mw(idempotency.WithLease(time.Minute))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(entered)
			<-held
		}))
		key := []string{redistest.Prefix()}
		done := make(chan struct{})
		go func() { serveOne(slow, key, reqBody); close(done) }()
		<-entered
		b.Cleanup(func() { close(held); <-done })
		return env.mw()(load.Handler(env.payload)), func(int) ([]string, string) { return key, "dup" }
	}},
	{"Mismatch", http.StatusUnprocessableEntity, func(b *testing.B, env *redisBenchEnv, n int) (http.Handler, func(int) ([]string, string)) {
		h := env.mw()(load.Handler(env.payload))
		key := []string{redistest.Prefix()}
		if st := serveOne(h, key, []byte("another body")); st != http.StatusCreated {
			b.Fatalf("first request: %d", st)
		}
		return h, func(int) ([]string, string) { return key, "dup" }
	}},
}

// BenchmarkMiddlewareRedis measures one request through the middleware over
// Redis, in process (no HTTP), beside the bare handler and the floor: the
// handler with the raw EVALSHA round trips of a trivial script that the
// middleware needs at best (Floor1: one, for replays and conflicts; Floor2:
// two around the handler, for first executions). clients=1 sends requests
// one after another; clients=64 from 64 goroutines. Besides ns/op (the
// inverse of throughput) it reports the p50 and p99 latency of a request.
func BenchmarkMiddlewareRedis(b *testing.B) {
	client := benchClient(b, 128)
	for _, size := range []int{0, 1 << 10, 64 << 10} {
		for _, clients := range []int{1, 64} {
			for _, bc := range redisBenchCases {
				b.Run(fmt.Sprintf("%s/body=%d/clients=%d", bc.name, size, clients), func(b *testing.B) {
					env := &redisBenchEnv{client: client, payload: load.Payload(size)}
					env.store = newStore(b, client)
					h, key := bc.setup(b, env, b.N+1)
					cpu := startCPU(b, client)
					runRedisBench(b, h, key, bc.status, clients)
					cpu.report(b)
				})
			}
		}
	}
}

// benchClient returns a client of the benchmarks' server with poolSize
// connections, closed when b ends.
func benchClient(b *testing.B, poolSize int) *redis.Client {
	client := redis.NewClient(&redis.Options{Addr: redistest.Addr(b), PoolSize: poolSize})
	b.Cleanup(func() { client.Close() })
	if err := client.Ping(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	return client
}

func runRedisBench(b *testing.B, h http.Handler, key func(int) ([]string, string), status, clients int) {
	var next atomic.Int64
	var mu sync.Mutex
	var all []time.Duration
	var failed atomic.Value
	loop := func(more func() bool) {
		send := requester(h, key)
		lat := make([]time.Duration, 0, 1024)
		for more() {
			d, got := send(int(next.Add(1) - 1))
			lat = append(lat, d)
			if got != status {
				failed.CompareAndSwap(nil, fmt.Sprintf("status %d, want %d", got, status))
			}
		}
		mu.Lock()
		all = append(all, lat...)
		mu.Unlock()
	}
	b.ReportAllocs()
	b.ResetTimer()
	if clients == 1 {
		i := 0
		loop(func() bool { i++; return i <= b.N })
	} else {
		b.SetParallelism((clients + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
		b.RunParallel(func(pb *testing.PB) { loop(pb.Next) })
	}
	b.StopTimer()
	if msg := failed.Load(); msg != nil {
		b.Fatal(msg)
	}
	reportPercentiles(b, all)
}

// reportPercentiles reports the p50 and p99 of lat, in microseconds.
func reportPercentiles(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	at := func(q float64) float64 {
		return float64(lat[min(len(lat)-1, int(q*float64(len(lat))))]) / float64(time.Microsecond)
	}
	b.ReportMetric(at(0.50), "p50-µs")
	b.ReportMetric(at(0.99), "p99-µs")
}

// cpuMeter measures the CPU time this process and the Redis server spend
// while a benchmark runs. Where both share the machine's cores, their sum
// per request is what bounds throughput with many clients.
type cpuMeter struct {
	client       *redis.Client
	proc, server time.Duration
}

func startCPU(b *testing.B, c *redis.Client) *cpuMeter {
	m := &cpuMeter{client: c}
	m.proc, m.server = processCPU(), serverCPU(b, c)
	return m
}

// report adds proc-cpu-µs/op and redis-cpu-µs/op to b's results.
func (m *cpuMeter) report(b *testing.B) {
	proc, server := processCPU()-m.proc, serverCPU(b, m.client)-m.server
	if proc > 0 {
		b.ReportMetric(float64(proc)/float64(time.Microsecond)/float64(b.N), "proc-cpu-µs/op")
	}
	b.ReportMetric(float64(server)/float64(time.Microsecond)/float64(b.N), "redis-cpu-µs/op")
}

// serverCPU is the server's used_cpu_sys + used_cpu_user.
func serverCPU(b *testing.B, c *redis.Client) time.Duration {
	info, err := load.Info(ctx, c, "cpu")
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, name := range []string{"used_cpu_sys", "used_cpu_user"} {
		v, err := strconv.ParseFloat(info[name], 64)
		if err != nil {
			b.Fatalf("INFO cpu %s: %v", name, err)
		}
		total += v
	}
	return time.Duration(total * float64(time.Second))
}

// recordFloor is the handler of the Record1 and Record2 cases.
func recordFloor(env *redisBenchEnv, key func(*http.Request) string) http.Handler {
	next := load.Handler(env.payload)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k := key(r)
		if r.Header.Get(load.HeaderKind) == "dup" {
			v, err := load.RecordReadScript.Run(r.Context(), env.client, []string{k}).Slice()
			if err != nil || len(v) != 2 {
				http.Error(w, fmt.Sprint(err), http.StatusServiceUnavailable)
				return
			}
			body, _ := v[1].(string)
			w.Header()["Content-Type"] = []string{"application/json"}
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, body)
			return
		}
		if err := load.RecordNewScript.Run(r.Context(), env.client, []string{k}, "300000").Err(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		next.ServeHTTP(w, r)
		// The response is written; as in load.FloorHandler, a failed
		// second trip can change nothing in it.
		_ = load.RecordDoneScript.Run(r.Context(), env.client, []string{k}, "300000", "meta", env.payload).Err()
	})
}

// storeReq is an AcquireRequest of the store-alone cases, with a
// fingerprint and token of the middleware's sizes.
func storeReq(key, token string) idempotency.AcquireRequest {
	return idempotency.AcquireRequest{Key: key, Token: token, Fingerprint: storeFingerprint,
		Lease: 10 * time.Second, TTL: 5 * time.Minute}
}

var storeFingerprint = strings.Repeat("f", 64)

// storeResponse is what load.Handler writes, as the store keeps it.
func storeResponse(payload []byte) *idempotency.Response {
	return &idempotency.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: payload}
}

// storeAlone is the handler of the Store1 and Store2 cases: Acquire; then
// either the stored response written back, or the handler and Complete.
func storeAlone(env *redisBenchEnv, key func() string) http.Handler {
	next := load.Handler(env.payload)
	var tokens atomic.Int64
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k, token := key(), strconv.FormatInt(tokens.Add(1), 16)
		acq, err := env.store.Acquire(r.Context(), storeReq(k, token))
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
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
		// The response is written; as in load.FloorHandler, a failed
		// second trip can change nothing in it.
		_ = env.store.Complete(r.Context(), k, token, storeResponse(env.payload), 5*time.Minute)
	})
}

// BenchmarkMiddlewareRedisPaired measures, from one client, the middleware
// against its floors in lockstep: every op sends one request to the floor
// (Floor1 for Replay, Floor2 for FirstExecution), one to the record floor
// (Record1, Record2), one to the store alone (Store1, Store2) and one
// through the middleware, in an order that rotates from op to op, so that
// all four see the same background load.
// On a shared machine the load changes from one sub-benchmark to the next
// by more than the differences measured, so the one-client ratios of
// BenchmarkMiddlewareRedis, taken between rows run seconds apart, move by
// tens of per cent from run to run; these do not. It reports the mean time
// of each kind of request and their ratios (see reportSet).
func BenchmarkMiddlewareRedisPaired(b *testing.B) {
	client := benchClient(b, 8)
	for _, size := range []int{1 << 10} {
		for _, set := range benchSets {
			b.Run(fmt.Sprintf("%s/body=%d", set[len(set)-1], size), func(b *testing.B) {
				hs, keys, want := setupSet(b, client, size, set, b.N+1)
				var sends [setSize]func(i int) (time.Duration, int)
				for j := range set {
					sends[j] = requester(hs[j], keys[j])
				}
				var total [setSize]time.Duration
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					for j := range setSize {
						k := (i + j) % setSize
						d, got := sends[k](i)
						if got != want[k] {
							b.Fatalf("%s: status %d, want %d", set[k], got, want[k])
						}
						total[k] += d
					}
				}
				b.StopTimer()
				reportSet(b, total, b.N)
			})
		}
	}
}

// reportSet reports the time per request of floor, record floor, store
// alone and middleware (total holds the time each took for requests
// requests: floor-µs/req, record-µs/req, store-µs/req, mw-µs/req), their
// ratios to the floor (mw/floor: target ≤ 1.25; record/floor, store/floor)
// and the middleware's to the store alone (mw/store).
func reportSet(b *testing.B, total [setSize]time.Duration, requests int) {
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(requests) }
	b.ReportMetric(us(total[0]), "floor-µs/req")
	b.ReportMetric(us(total[1]), "record-µs/req")
	b.ReportMetric(us(total[2]), "store-µs/req")
	b.ReportMetric(us(total[3]), "mw-µs/req")
	b.ReportMetric(float64(total[3])/float64(total[0]), "mw/floor")
	b.ReportMetric(float64(total[1])/float64(total[0]), "record/floor")
	b.ReportMetric(float64(total[2])/float64(total[0]), "store/floor")
	b.ReportMetric(float64(total[3])/float64(total[2]), "mw/store")
}

// benchSets are the floor, record floor, store-alone and middleware cases
// measured side by side: for replays, and for first executions.
var benchSets = [][setSize]string{
	{"Floor1", "Record1", "Store1", "Replay"},
	{"Floor2", "Record2", "Store2", "FirstExecution"},
}

const setSize = 4

// setupSet sets up the cases of set on a new store over client, with a
// payload of size bytes and room for n requests each, and returns their
// handlers, keys and the status each must answer.
func setupSet(b *testing.B, client *redis.Client, size int, set [setSize]string, n int) (hs [setSize]http.Handler, keys [setSize]func(int) ([]string, string), want [setSize]int) {
	env := &redisBenchEnv{client: client, payload: load.Payload(size)}
	env.store = newStore(b, client)
	for j, name := range set {
		i := slices.IndexFunc(redisBenchCases, func(c redisBenchCase) bool { return c.name == name })
		hs[j], keys[j] = redisBenchCases[i].setup(b, env, n)
		want[j] = redisBenchCases[i].status
	}
	return hs, keys, want
}

// BenchmarkMiddlewareRedisPhased measures the middleware against its floors
// with 64 concurrent clients, in phases that alternate quickly: each op runs
// four phases, one per kind of request (floor, record floor, store alone,
// middleware) in an order that rotates from op to op, and in each phase 64
// goroutines send 25 requests each. The rows of BenchmarkMiddlewareRedis run seconds apart,
// and with 64 clients the two processes share the machine's two cores, so
// any other load changes them; phases a fraction of a second long see the
// same load. It reports the time per request of each kind (the inverse of
// its throughput) and their ratios (see reportSet).
func BenchmarkMiddlewareRedisPhased(b *testing.B) {
	const clients, perPhase, size = 64, 25, 1 << 10
	client := benchClient(b, 2*clients)
	for _, set := range benchSets {
		b.Run(fmt.Sprintf("%s/body=%d/clients=%d", set[len(set)-1], size, clients), func(b *testing.B) {
			hs, keys, want := setupSet(b, client, size, set, b.N*clients*perPhase+1)
			var sends [clients][setSize]func(i int) (time.Duration, int)
			for g := range sends {
				for j := range set {
					sends[g][j] = requester(hs[j], keys[j])
				}
			}
			var failed atomic.Value
			var total [setSize]time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for j := range setSize {
					k := (i + j) % setSize
					total[k] += runPhase(clients, perPhase, func(g, r int) {
						if _, got := sends[g][k]((i*clients+g)*perPhase + r); got != want[k] {
							failed.CompareAndSwap(nil, fmt.Sprintf("%s: status %d, want %d", set[k], got, want[k]))
						}
					})
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

// runPhase runs f(g, r) for r < perGoroutine in each of goroutines
// goroutines g, and returns how long the phase took.
func runPhase(goroutines, perGoroutine int, f func(g, r int)) time.Duration {
	var wg sync.WaitGroup
	start := time.Now()
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range perGoroutine {
				f(g, r)
			}
		}()
	}
	wg.Wait()
	return time.Since(start)
}

// requester returns a function that sends request i to h and returns how
// long it took and the status it got. It reuses one request and one
// writer, so each goroutine needs its own.
func requester(h http.Handler, key func(int) ([]string, string)) func(i int) (time.Duration, int) {
	r, _ := http.NewRequest(http.MethodPost, "http://example.com/payments", nil)
	body := &rewindBody{}
	w := &discardWriter{h: http.Header{}}
	return func(i int) (time.Duration, int) {
		body.Reset(reqBody)
		r.Body, r.ContentLength = body, int64(len(reqBody))
		k, kind := key(i)
		if k != nil {
			r.Header["Idempotency-Key"] = k
		}
		r.Header[load.HeaderKind] = []string{kind}
		w.reset()
		start := time.Now()
		h.ServeHTTP(w, r)
		return time.Since(start), w.status
	}
}
