package reliability_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/memstore"
	"github.com/go-idempotency/idempotency/redisstore"
)

// fastClient returns a Redis client whose faults surface fast: short dial,
// read and write timeouts and at most one retry.
func fastClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:         addr,
		DialTimeout:  200 * time.Millisecond,
		ReadTimeout:  200 * time.Millisecond,
		WriteTimeout: 200 * time.Millisecond,
		PoolTimeout:  300 * time.Millisecond,
		MaxRetries:   1,
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// newRedisStore returns a Store over c under a prefix unique to the call.
func newRedisStore(t testing.TB, c redis.UniversalClient, opts ...redisstore.Option) *redisstore.Store {
	t.Helper()
	s := redisstore.New(c, append([]redisstore.Option{redisstore.WithPrefix(redistest.Prefix())}, opts...)...)
	t.Cleanup(func() { s.Close() })
	return s
}

// newRedisStoreWithPrefix returns a Store over c under prefix, for stores
// that share records.
func newRedisStoreWithPrefix(t testing.TB, c redis.UniversalClient, prefix string) *redisstore.Store {
	t.Helper()
	s := redisstore.New(c, redisstore.WithPrefix(prefix))
	t.Cleanup(func() { s.Close() })
	return s
}

// newMemstore returns a memstore closed when t ends.
func newMemstore(t testing.TB) *memstore.Store {
	t.Helper()
	s := memstore.New()
	t.Cleanup(func() { s.Close() })
	return s
}

// events collects the middleware's events.
type events struct {
	mu  sync.Mutex
	all []idempotency.Event
}

func (e *events) observe(_ context.Context, ev idempotency.Event) {
	e.mu.Lock()
	e.all = append(e.all, ev)
	e.mu.Unlock()
}

// count returns how many events of kind were seen whose error, if match is
// not empty, mentions match.
func (e *events) count(kind idempotency.EventKind, match string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, ev := range e.all {
		if ev.Kind == kind && (match == "" || (ev.Err != nil && strings.Contains(ev.Err.Error(), match))) {
			n++
		}
	}
	return n
}

// outcomes returns how many outcome events were seen.
func (e *events) outcomes() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, ev := range e.all {
		if ev.Final {
			n++
		}
	}
	return n
}

func (e *events) find(kind idempotency.EventKind) (idempotency.Event, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ev := range e.all {
		if ev.Kind == kind {
			return ev, true
		}
	}
	return idempotency.Event{}, false
}

func (e *events) String() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var b strings.Builder
	for _, ev := range e.all {
		fmt.Fprintf(&b, "%v(%d, %v) ", ev.Kind, ev.Status, ev.Err)
	}
	return b.String()
}

// waitUntil polls cond every 5ms until it holds, failing t after timeout.
func waitUntil(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// retryPast409 calls post until its answer is not 409, as a client
// honouring Retry-After would (faster, to keep the tests short), for at most
// 15 seconds.
func retryPast409(t testing.TB, post func() answer) answer {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		a := post()
		if a.status != http.StatusConflict || time.Now().After(deadline) {
			return a
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// answer is a client's view of one response.
type answer struct {
	status   int
	body     string
	replayed bool
	code     string // the problem code, for problem responses
	err      error
}

func (a answer) String() string {
	if a.err != nil {
		return "error: " + a.err.Error()
	}
	return fmt.Sprintf("%d replayed=%v %q", a.status, a.replayed, a.body)
}

// postKey sends a POST with the Idempotency-Key key and body, and extra
// headers given as name, value pairs.
func postKey(client *http.Client, url, key, body string, headers ...string) answer {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	if key != "" {
		req.Header.Set(idempotency.HeaderKey, key)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	res, err := client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	a := answer{status: res.StatusCode, body: string(b), replayed: res.Header.Get(idempotency.HeaderReplayed) == "true", err: err}
	if strings.HasPrefix(res.Header.Get("Content-Type"), "application/problem+json") {
		if i := strings.Index(a.body, `"code":"`); i >= 0 {
			rest := a.body[i+len(`"code":"`):]
			a.code = rest[:strings.IndexByte(rest, '"')]
		}
	}
	return a
}

// executions counts handler executions per Idempotency-Key and numbers them.
type executions struct {
	seq    atomic.Int64
	mu     sync.Mutex
	byKey  map[string]int
	starts map[string][]time.Time
}

func newExecutions() *executions {
	return &executions{byKey: map[string]int{}, starts: map[string][]time.Time{}}
}

// start records an execution for key and returns its id.
func (e *executions) start(key string) int64 {
	e.mu.Lock()
	e.byKey[key]++
	e.starts[key] = append(e.starts[key], time.Now())
	e.mu.Unlock()
	return e.seq.Add(1)
}

// startTimes returns when the executions of key started.
func (e *executions) startTimes(key string) []time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]time.Time(nil), e.starts[key]...)
}

func (e *executions) of(key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.byKey[key]
}

func (e *executions) total() int64 { return e.seq.Load() }

// echo is the body a handler answers for an execution: the key, the request
// body and the execution id, so that a replay can be traced to its origin.
func echo(key, body string, id int64) string {
	return fmt.Sprintf("key=%s body=%s exec=%d", key, body, id)
}

// echoHandler answers 201 with echo after running before (if any, and not
// for the key "warm-up"), which may block or inspect the request's context.
func echoHandler(ex *executions, before func(r *http.Request)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(idempotency.HeaderKey)
		id := ex.start(key)
		body, _ := io.ReadAll(r.Body)
		if before != nil && key != "warm-up" {
			before(r)
		}
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, echo(key, string(body), id))
	})
}

// serve starts a real HTTP server for h, closed when t ends.
func serve(t testing.TB, h http.Handler) (*httptest.Server, *http.Client) {
	t.Helper()
	srv := httptest.NewServer(h)
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	t.Cleanup(func() {
		client.CloseIdleConnections()
		srv.Close()
	})
	return srv, client
}

// gate lets a test hold handlers inside their execution.
type gate struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func newGate() *gate {
	return &gate{entered: make(chan struct{}, 16), release: make(chan struct{})}
}

// wait signals entry and blocks until the gate opens or ctx ends; it
// returns ctx's cause if ctx ended first.
func (g *gate) wait(ctx context.Context) error {
	g.entered <- struct{}{}
	select {
	case <-g.release:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func (g *gate) open() { g.once.Do(func() { close(g.release) }) }

func (g *gate) waitEntered(t testing.TB) {
	t.Helper()
	select {
	case <-g.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler never started")
	}
}
