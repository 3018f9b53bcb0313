package idempotency_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/fakeclock"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/memstore"
)

// newMemStore returns a memstore closed when the test ends.
func newMemStore(t testing.TB, opts ...memstore.Option) *memstore.Store {
	t.Helper()
	s := memstore.New(opts...)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// counter is a handler that counts its executions and answers 201 with a
// body naming the execution and echoing the request body.
type counter struct {
	n      atomic.Int64
	status int
}

func (c *counter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := c.n.Add(1)
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Execution", fmt.Sprint(n))
	status := c.status
	if status == 0 {
		status = http.StatusCreated
	}
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"execution":%d,"echo":%q}`, n, body)
}

type step struct {
	name     string
	method   string
	path     string
	key      string // "" sends no key; "<none>" too
	keys     []string
	user     string
	body     string
	wantCode int
	// wantReplayed asks for Idempotent-Replayed: true.
	wantReplayed bool
	// wantSameAs asks for the exact body of an earlier step's response.
	wantSameAs string
	// wantProblem asks for a problem document with this code.
	wantProblem idempotency.Code
	// wantExecutions is the handler's execution count after the step.
	wantExecutions int64
}

func runSteps(t *testing.T, mw func(http.Handler) http.Handler, h *counter, steps []step) {
	t.Helper()
	srv := mw(h)
	bodies := map[string]string{}
	for _, s := range steps {
		method := s.method
		if method == "" {
			method = http.MethodPost
		}
		path := s.path
		if path == "" {
			path = "/payments"
		}
		req := httptest.NewRequest(method, path, strings.NewReader(s.body))
		if s.key != "" {
			req.Header.Set("Idempotency-Key", s.key)
		}
		for _, k := range s.keys {
			req.Header.Add("Idempotency-Key", k)
		}
		if s.user != "" {
			req.Header.Set("X-User", s.user)
		}
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req)
		res := rec.Result()
		got, _ := io.ReadAll(res.Body)
		if res.StatusCode != s.wantCode {
			t.Fatalf("%s: status %d, want %d (body %s)", s.name, res.StatusCode, s.wantCode, got)
		}
		if replayed := res.Header.Get("Idempotent-Replayed") == "true"; replayed != s.wantReplayed {
			t.Fatalf("%s: replayed=%v, want %v", s.name, replayed, s.wantReplayed)
		}
		if s.wantSameAs != "" && string(got) != bodies[s.wantSameAs] {
			t.Fatalf("%s: body %q, want the body of %q: %q", s.name, got, s.wantSameAs, bodies[s.wantSameAs])
		}
		if s.wantProblem != "" {
			if ct := res.Header.Get("Content-Type"); ct != "application/problem+json" {
				t.Fatalf("%s: Content-Type %q, want application/problem+json", s.name, ct)
			}
			var p idempotency.Problem
			if err := json.Unmarshal(got, &p); err != nil {
				t.Fatalf("%s: problem body %q: %v", s.name, got, err)
			}
			if p.Code != s.wantProblem || p.Status != s.wantCode || p.Type == "" || p.Title == "" {
				t.Fatalf("%s: problem %+v, want code %s status %d", s.name, p, s.wantProblem, s.wantCode)
			}
		}
		if n := h.n.Load(); n != s.wantExecutions {
			t.Fatalf("%s: handler ran %d times, want %d", s.name, n, s.wantExecutions)
		}
		bodies[s.name] = string(got)
	}
}

func TestSequences(t *testing.T) {
	scope := idempotency.WithKeyScope(func(r *http.Request) string { return r.Header.Get("X-User") })
	tests := []struct {
		name   string
		opts   []idempotency.Option
		status int
		steps  []step
	}{
		{
			name: "replay then mismatch then corrected retry",
			steps: []step{
				{name: "first", key: "k1", body: `{"amount":100}`, wantCode: 201, wantExecutions: 1},
				{name: "replay", key: "k1", body: `{"amount":100}`, wantCode: 201, wantReplayed: true, wantSameAs: "first", wantExecutions: 1},
				{name: "changed body", key: "k1", body: `{"amount":999}`, wantCode: 422, wantProblem: idempotency.CodeFingerprintMismatch, wantExecutions: 1},
				{name: "changed query", key: "k1", path: "/payments?x=1", body: `{"amount":100}`, wantCode: 422, wantProblem: idempotency.CodeFingerprintMismatch, wantExecutions: 1},
				{name: "changed path", key: "k1", path: "/refunds", body: `{"amount":100}`, wantCode: 422, wantProblem: idempotency.CodeFingerprintMismatch, wantExecutions: 1},
				{name: "corrected retry", key: "k1", body: `{"amount":100}`, wantCode: 201, wantReplayed: true, wantSameAs: "first", wantExecutions: 1},
				{name: "quoted form is the same key", key: `"k1"`, body: `{"amount":100}`, wantCode: 201, wantReplayed: true, wantSameAs: "first", wantExecutions: 1},
				{name: "other key", key: "k2", body: `{"amount":100}`, wantCode: 201, wantExecutions: 2},
				{name: "patch is covered", method: http.MethodPatch, key: "k3", body: `x`, wantCode: 201, wantExecutions: 3},
				{name: "patch replay", method: http.MethodPatch, key: "k3", body: `x`, wantCode: 201, wantReplayed: true, wantSameAs: "patch is covered", wantExecutions: 3},
			},
		},
		{
			name: "keys optional by default; other methods pass through",
			steps: []step{
				{name: "no key", body: "a", wantCode: 201, wantExecutions: 1},
				{name: "no key again", body: "a", wantCode: 201, wantExecutions: 2},
				{name: "put with key", method: http.MethodPut, key: "k", body: "a", wantCode: 201, wantExecutions: 3},
				{name: "put with key again", method: http.MethodPut, key: "k", body: "a", wantCode: 201, wantExecutions: 4},
				{name: "get with malformed key", method: http.MethodGet, key: `"bad`, wantCode: 201, wantExecutions: 5},
			},
		},
		{
			name: "key required",
			opts: []idempotency.Option{idempotency.WithKeyRequired(true)},
			steps: []step{
				{name: "no key", body: "a", wantCode: 400, wantProblem: idempotency.CodeKeyRequired},
				{name: "with key", key: "k", body: "a", wantCode: 201, wantExecutions: 1},
				{name: "get without key", method: http.MethodGet, wantCode: 201, wantExecutions: 2},
			},
		},
		{
			name: "malformed keys",
			steps: []step{
				{name: "too long", key: strings.Repeat("k", 256), wantCode: 400, wantProblem: idempotency.CodeKeyInvalid},
				{name: "control character", key: "a\x01b", wantCode: 400, wantProblem: idempotency.CodeKeyInvalid},
				{name: "space inside bare key", key: "a b", wantCode: 400, wantProblem: idempotency.CodeKeyInvalid},
				{name: "bad quoting", key: `"abc`, wantCode: 400, wantProblem: idempotency.CodeKeyInvalid},
				{name: "empty quoted", key: `""`, wantCode: 400, wantProblem: idempotency.CodeKeyInvalid},
				{name: "two header lines", keys: []string{"a", "b"}, wantCode: 400, wantProblem: idempotency.CodeKeyInvalid},
				{name: "255 bytes is fine", key: strings.Repeat("k", 255), wantCode: 201, wantExecutions: 1},
			},
		},
		{
			name: "request body cap",
			opts: []idempotency.Option{idempotency.WithMaxRequestBody(10)},
			steps: []step{
				{name: "over the cap", key: "k", body: strings.Repeat("x", 11), wantCode: 413, wantProblem: idempotency.CodeBodyTooLarge},
				{name: "at the cap", key: "k", body: strings.Repeat("x", 10), wantCode: 201, wantExecutions: 1},
				{name: "replay at the cap", key: "k", body: strings.Repeat("x", 10), wantCode: 201, wantReplayed: true, wantSameAs: "at the cap", wantExecutions: 1},
			},
		},
		{
			name:   "5xx releases the key",
			status: http.StatusBadGateway,
			steps: []step{
				{name: "first fails", key: "k", body: "a", wantCode: 502, wantExecutions: 1},
				{name: "retry runs again", key: "k", body: "a", wantCode: 502, wantExecutions: 2},
				{name: "even with another body", key: "k", body: "b", wantCode: 502, wantExecutions: 3},
			},
		},
		{
			name:   "4xx is stored",
			status: http.StatusPaymentRequired,
			steps: []step{
				{name: "declined", key: "k", body: "a", wantCode: 402, wantExecutions: 1},
				{name: "replayed", key: "k", body: "a", wantCode: 402, wantReplayed: true, wantSameAs: "declined", wantExecutions: 1},
			},
		},
		{
			name:   "release predicate",
			status: http.StatusConflict,
			opts:   []idempotency.Option{idempotency.WithReleaseStatus(func(s int) bool { return s >= 400 })},
			steps: []step{
				{name: "first", key: "k", body: "a", wantCode: 409, wantExecutions: 1},
				{name: "runs again", key: "k", body: "a", wantCode: 409, wantExecutions: 2},
			},
		},
		{
			name: "scoped keys never meet",
			opts: []idempotency.Option{scope},
			steps: []step{
				{name: "alice", key: "k", user: "alice", body: "a", wantCode: 201, wantExecutions: 1},
				{name: "bob same key", key: "k", user: "bob", body: "a", wantCode: 201, wantExecutions: 2},
				{name: "bob other body", key: "k", user: "bob", body: "b", wantCode: 422, wantProblem: idempotency.CodeFingerprintMismatch, wantExecutions: 2},
				{name: "alice replay", key: "k", user: "alice", body: "a", wantCode: 201, wantReplayed: true, wantSameAs: "alice", wantExecutions: 2},
				{name: "bob replay", key: "k", user: "bob", body: "a", wantCode: 201, wantReplayed: true, wantSameAs: "bob same key", wantExecutions: 2},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &counter{status: tt.status}
			runSteps(t, idempotency.New(newMemStore(t), tt.opts...), h, tt.steps)
		})
	}
}

// do sends one request through mw(h) in process.
func do(h http.Handler, method, key, body string) *http.Response {
	req := httptest.NewRequest(method, "/x", strings.NewReader(body))
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

func readAll(t testing.TB, r *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestWriteHeaderThenCopyReplays(t *testing.T) {
	var runs atomic.Int64
	payload := bytes.Repeat([]byte("0123456789abcdef"), 5000) // 80 KB, several copy chunks
	h := idempotency.New(newMemStore(t))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusCreated)
		if _, err := io.Copy(w, io.LimitReader(bytes.NewReader(payload), int64(len(payload)))); err != nil {
			t.Error(err)
		}
		io.WriteString(w, "tail")
	}))
	first := do(h, http.MethodPost, "k", "")
	second := do(h, http.MethodPost, "k", "")
	want := string(payload) + "tail"
	if first.StatusCode != 201 || second.StatusCode != 201 {
		t.Fatalf("statuses %d, %d", first.StatusCode, second.StatusCode)
	}
	if readAll(t, first) != want || readAll(t, second) != want {
		t.Fatal("replayed body differs from the original")
	}
	if second.Header.Get("Content-Type") != "application/octet-stream" || second.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay headers %v", second.Header)
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times", runs.Load())
	}
}

func TestHeaderSnapshotAndPolicy(t *testing.T) {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("X-Before", "1")
		h.Add("X-Multi", "a")
		h.Add("X-Multi", "b")
		h.Set("Set-Cookie", "session=secret")
		h.Set("Date", "Mon, 01 Jan 2024 00:00:00 GMT")
		h.Set("Connection", "X-Conn-Specific")
		h.Set("X-Conn-Specific", "hop")
		h.Set("Keep-Alive", "timeout=5")
		w.WriteHeader(http.StatusOK)
		h.Set("X-After", "late") // after the status: not part of the response
		io.WriteString(w, "ok")
	})
	for _, cookies := range []bool{false, true} {
		t.Run(fmt.Sprintf("setcookie=%v", cookies), func(t *testing.T) {
			mw := idempotency.New(newMemStore(t), idempotency.WithStoreSetCookie(cookies))(handler)
			do(mw, http.MethodPost, "k", "")
			res := do(mw, http.MethodPost, "k", "")
			h := res.Header
			if h.Get("X-Before") != "1" || strings.Join(h.Values("X-Multi"), ",") != "a,b" {
				t.Fatalf("stored headers lost: %v", h)
			}
			for _, k := range []string{"X-After", "Date", "Connection", "X-Conn-Specific", "Keep-Alive"} {
				if v := h.Get(k); v != "" {
					t.Errorf("replay carries %s: %q", k, v)
				}
			}
			if got := h.Get("Set-Cookie") != ""; got != cookies {
				t.Errorf("Set-Cookie replayed=%v, want %v", got, cookies)
			}
		})
	}
}

func TestResponseOverCapReplaysWithoutBody(t *testing.T) {
	var runs atomic.Int64
	h := idempotency.New(newMemStore(t), idempotency.WithMaxResponseBody(100))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("X-Report", "big")
		w.Header().Set("Content-Length", "150")
		w.WriteHeader(http.StatusCreated)
		w.Write(bytes.Repeat([]byte("a"), 60))
		w.Write(bytes.Repeat([]byte("b"), 90))
	}))
	first := do(h, http.MethodPost, "k", "")
	if body := readAll(t, first); len(body) != 150 {
		t.Fatalf("first client got %d bytes, want all 150", len(body))
	}
	second := do(h, http.MethodPost, "k", "")
	if second.StatusCode != 201 || second.Header.Get("X-Report") != "big" {
		t.Fatalf("replay %d %v", second.StatusCode, second.Header)
	}
	if second.Header.Get(idempotency.HeaderBodyOmitted) != "true" || second.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay lacks the markers: %v", second.Header)
	}
	if body := readAll(t, second); body != "" {
		t.Fatalf("replay body %q, want empty", body)
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times", runs.Load())
	}
}

func TestPanicReleasesAndRepanics(t *testing.T) {
	for _, value := range []any{"boom", http.ErrAbortHandler} {
		t.Run(fmt.Sprint(value), func(t *testing.T) {
			var runs atomic.Int64
			var events []idempotency.EventKind
			var mu sync.Mutex
			obs := idempotency.WithObserver(func(_ context.Context, e idempotency.Event) {
				mu.Lock()
				if e.Final {
					events = append(events, e.Kind)
				}
				mu.Unlock()
			})
			h := idempotency.New(newMemStore(t), obs)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.Add(1) == 1 {
					panic(value)
				}
				w.WriteHeader(http.StatusCreated)
			}))
			func() {
				defer func() {
					if got := recover(); got != value {
						t.Fatalf("recovered %v, want %v", got, value)
					}
				}()
				do(h, http.MethodPost, "k", "")
				t.Fatal("the panic was swallowed")
			}()
			if res := do(h, http.MethodPost, "k", ""); res.StatusCode != 201 || res.Header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("retry after panic: %d %v", res.StatusCode, res.Header)
			}
			if runs.Load() != 2 {
				t.Fatalf("handler ran %d times, want 2", runs.Load())
			}
			mu.Lock()
			defer mu.Unlock()
			if len(events) != 2 || events[0] != idempotency.EventReleased || events[1] != idempotency.EventExecuted {
				t.Fatalf("events %v, want [released executed]", events)
			}
		})
	}
}

func TestProblemDocument(t *testing.T) {
	h := idempotency.New(newMemStore(t))(&counter{})
	res := do(h, http.MethodPost, `"unterminated`, "")
	var doc map[string]any
	if err := json.NewDecoder(res.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	for _, member := range []string{"type", "title", "status", "detail", "code"} {
		if _, ok := doc[member]; !ok {
			t.Errorf("problem lacks %q: %v", member, doc)
		}
	}
	if doc["status"] != float64(400) || doc["code"] != "key_invalid" {
		t.Fatalf("problem %v", doc)
	}
	if strings.Contains(fmt.Sprint(doc), "unterminated") {
		t.Fatalf("the problem echoes the client's key: %v", doc)
	}
}

func TestCustomErrorHandler(t *testing.T) {
	eh := idempotency.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, p *idempotency.Problem) {
		w.WriteHeader(p.Status)
		fmt.Fprintf(w, "custom %s", p.Code)
	})
	h := idempotency.New(newMemStore(t), eh, idempotency.WithKeyRequired(true))(&counter{})
	res := do(h, http.MethodPost, "", "")
	if res.StatusCode != 400 || readAll(t, res) != "custom key_required" {
		t.Fatalf("custom handler not used: %d", res.StatusCode)
	}
}

// failingStore is a memstore whose operations can be made to fail, standing
// in for a store that becomes unreachable.
type failingStore struct {
	idempotency.Store
	acquireErr atomic.Pointer[error]
	extendErr  atomic.Pointer[error]
	acquires   atomic.Int64
}

func (f *failingStore) Acquire(ctx context.Context, req idempotency.AcquireRequest) (idempotency.Acquisition, error) {
	f.acquires.Add(1)
	if e := f.acquireErr.Load(); e != nil {
		return idempotency.Acquisition{}, *e
	}
	return f.Store.Acquire(ctx, req)
}

func (f *failingStore) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	if e := f.extendErr.Load(); e != nil {
		return *e
	}
	return f.Store.Extend(ctx, key, token, lease)
}

func TestStoreUnavailable(t *testing.T) {
	down := errors.New("connection refused")
	t.Run("fail closed", func(t *testing.T) {
		fs := &failingStore{Store: newMemStore(t)}
		fs.acquireErr.Store(&down)
		var ev idempotency.Event
		c := &counter{}
		h := idempotency.New(fs, idempotency.WithObserver(func(_ context.Context, e idempotency.Event) { ev = e }))(c)
		res := do(h, http.MethodPost, "k", "")
		if res.StatusCode != 503 || res.Header.Get("Retry-After") == "" {
			t.Fatalf("status %d Retry-After %q", res.StatusCode, res.Header.Get("Retry-After"))
		}
		if !strings.Contains(readAll(t, res), string(idempotency.CodeStoreUnavailable)) {
			t.Fatal("problem code missing")
		}
		if c.n.Load() != 0 || ev.Kind != idempotency.EventStoreError || !errors.Is(ev.Err, down) {
			t.Fatalf("runs %d event %+v", c.n.Load(), ev)
		}
	})
	t.Run("fail open", func(t *testing.T) {
		fs := &failingStore{Store: newMemStore(t)}
		fs.acquireErr.Store(&down)
		var ev idempotency.Event
		c := &counter{}
		h := idempotency.New(fs, idempotency.WithFailOpen(true), idempotency.WithObserver(func(_ context.Context, e idempotency.Event) { ev = e }))(c)
		res := do(h, http.MethodPost, "k", "")
		if res.StatusCode != 201 || c.n.Load() != 1 {
			t.Fatalf("status %d runs %d", res.StatusCode, c.n.Load())
		}
		if ev.Kind != idempotency.EventStoreError || !ev.FailedOpen {
			t.Fatalf("event %+v", ev)
		}
	})
	t.Run("store full", func(t *testing.T) {
		c := &counter{}
		h := idempotency.New(newMemStore(t, memstore.WithMaxEntries(1)))(c)
		if res := do(h, http.MethodPost, "a", ""); res.StatusCode != 201 {
			t.Fatalf("first: %d", res.StatusCode)
		}
		res := do(h, http.MethodPost, "b", "")
		if res.StatusCode != 503 || !strings.Contains(readAll(t, res), string(idempotency.CodeStoreFull)) {
			t.Fatalf("full store: %d", res.StatusCode)
		}
		if c.n.Load() != 1 {
			t.Fatalf("runs %d", c.n.Load())
		}
		if res := do(h, http.MethodPost, "a", ""); res.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatal("a full store lost the existing record")
		}
	})
}

func TestObserverAndLogsNeverCarryRawKey(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	var events []idempotency.Event
	logger := newTestLogger(&logs)
	c := &counter{}
	h := idempotency.New(newMemStore(t),
		idempotency.WithLogger(logger),
		idempotency.WithRoute(func(r *http.Request) string { return "/x" }),
		idempotency.WithObserver(func(_ context.Context, e idempotency.Event) {
			mu.Lock()
			if e.Kind != idempotency.EventStarted {
				events = append(events, e)
			}
			mu.Unlock()
		}))(c)
	const secret = "sk-very-secret-key"
	do(h, http.MethodPost, secret, "card=4242424242424242")
	do(h, http.MethodPost, secret, "card=4242424242424242")
	do(h, http.MethodPost, secret, "card=5555555555554444")
	want := []idempotency.EventKind{idempotency.EventExecuted, idempotency.EventReplayed, idempotency.EventMismatch}
	if len(events) != len(want) {
		t.Fatalf("events %v", events)
	}
	for i, e := range events {
		if e.Kind != want[i] || e.Route != "/x" || e.Method != "POST" || len(e.Key) != 64 || e.Duration <= 0 {
			t.Errorf("event %d: %+v, want kind %v", i, e, want[i])
		}
	}
	out := logs.String()
	if !strings.Contains(out, "event=replayed") {
		t.Fatalf("logger got nothing: %q", out)
	}
	if strings.Contains(out, secret) || strings.Contains(out, "4242") {
		t.Fatalf("logs carry the raw key or body: %q", out)
	}
}

// TestClientGoneBeforeAcquire: a request whose client has gone is not run,
// not even in fail-open mode, where a store error would otherwise let it run
// unprotected.
func TestClientGoneBeforeAcquire(t *testing.T) {
	c := &counter{}
	h := idempotency.New(newMemStore(t), idempotency.WithFailOpen(true))(c)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("x")).WithContext(ctx)
	req.Header.Set("Idempotency-Key", "k")
	h.ServeHTTP(httptest.NewRecorder(), req)
	if c.n.Load() != 0 {
		t.Fatalf("handler ran %d times for a client that had gone", c.n.Load())
	}
	if res := do(h, http.MethodPost, "k", "x"); res.StatusCode != 201 || c.n.Load() != 1 {
		t.Fatalf("the key was left taken: %d", res.StatusCode)
	}
}

// TestPerRouteOptions: two middlewares on one store, each with its own TTL
// and key requirement, as chi's r.With gives each route.
func TestPerRouteOptions(t *testing.T) {
	clock := fakeclock.New(time.Unix(1_700_000_000, 0))
	store := newMemStore(t, memstore.WithClock(clock.Now))
	short, long := &counter{}, &counter{}
	shortRoute := idempotency.New(store, idempotency.WithTTL(time.Minute))(short)
	longRoute := idempotency.New(store, idempotency.WithTTL(time.Hour), idempotency.WithKeyRequired(true))(long)

	do(shortRoute, http.MethodPost, "k-short", "a")
	do(longRoute, http.MethodPost, "k-long", "a")
	clock.Advance(2 * time.Minute)
	if res := do(shortRoute, http.MethodPost, "k-short", "a"); res.Header.Get("Idempotent-Replayed") != "" || short.n.Load() != 2 {
		t.Fatalf("short-TTL route replayed after its TTL (runs %d)", short.n.Load())
	}
	if res := do(longRoute, http.MethodPost, "k-long", "a"); res.Header.Get("Idempotent-Replayed") != "true" || long.n.Load() != 1 {
		t.Fatalf("long-TTL route did not replay within its TTL (runs %d)", long.n.Load())
	}
	if res := do(shortRoute, http.MethodPost, "", "a"); res.StatusCode != 201 {
		t.Fatalf("short route without key: %d, want pass-through", res.StatusCode)
	}
	if res := do(longRoute, http.MethodPost, "", "a"); res.StatusCode != 400 {
		t.Fatalf("long route without key: %d, want 400", res.StatusCode)
	}
}

// TestNonCanonicalSetCookie: a cookie set under a name that is not in
// canonical form ("set-cookie") is still a cookie: it reaches the first
// client but is neither stored nor replayed to whoever presents the key.
func TestNonCanonicalSetCookie(t *testing.T) {
	h := idempotency.New(newMemStore(t))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header()["set-cookie"] = []string{"session=victim"}
		w.Header()["keep-alive"] = []string{"timeout=1"}
		w.Header()["x-order"] = []string{"42"}
		w.WriteHeader(http.StatusCreated)
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	first, _ := post(t, srv.Client(), srv.URL, "k", "")
	if first.Header.Get("Set-Cookie") != "session=victim" {
		t.Fatalf("first client's cookie missing: %v", first.Header)
	}
	replay, _ := post(t, srv.Client(), srv.URL, "k", "")
	if replay.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("no replay")
	}
	if c := replay.Header.Values("Set-Cookie"); len(c) != 0 {
		t.Fatalf("replay carries the first client's cookie: %q", c)
	}
	if replay.Header.Get("Keep-Alive") == "timeout=1" || replay.Header.Get("X-Order") != "42" {
		t.Fatalf("replay headers %v", replay.Header)
	}
	reliability.Report(t, reliability.Result{Scenario: "security: Set-Cookie replayed only by opt-in", Store: "memstore",
		Operations: 2, Faults: 1, Note: "non-canonical names (set-cookie, keep-alive) filtered too"})
}

// TestProblemForClients: the detail a client reads carries no Go package
// prefix, and the type points where WithProblemTypeBase says.
func TestProblemForClients(t *testing.T) {
	h := idempotency.New(newMemStore(t), idempotency.WithProblemTypeBase("https://api.example.com/docs/errors#"))(&counter{})
	res := do(h, http.MethodPost, `"unterminated`, "")
	var p idempotency.Problem
	if err := json.Unmarshal([]byte(readAll(t, res)), &p); err != nil {
		t.Fatal(err)
	}
	if p.Code != idempotency.CodeKeyInvalid || strings.Contains(p.Detail, "idempotency:") || !strings.Contains(p.Detail, "quot") {
		t.Fatalf("detail %q", p.Detail)
	}
	if p.Type != "https://api.example.com/docs/errors#key_invalid" {
		t.Fatalf("type %q", p.Type)
	}
}
