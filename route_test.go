package idempotency_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/go-idempotency/idempotency"
)

// TestRouteServeMux: events name the ServeMux pattern that served the
// request, whether the middleware wraps one route's handler or the whole
// mux, for executed requests and replays alike.
func TestRouteServeMux(t *testing.T) {
	created := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	for _, wrapMux := range []bool{false, true} {
		var mu sync.Mutex
		got := map[idempotency.EventKind]string{}
		mw := idempotency.New(newMemStore(t), idempotency.WithObserver(func(_ context.Context, e idempotency.Event) {
			mu.Lock()
			got[e.Kind] = e.Route
			mu.Unlock()
		}))
		mux := http.NewServeMux()
		var h http.Handler = mux
		if wrapMux {
			mux.Handle("POST /payments/{id}", created)
			h = mw(mux)
		} else {
			mux.Handle("POST /payments/{id}", mw(created))
		}
		for i := 0; i < 2; i++ {
			req := newPost("/payments/42", "k")
			rec := newRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusCreated {
				t.Fatalf("wrapMux=%v request %d: %d", wrapMux, i, rec.Code)
			}
		}
		for _, kind := range []idempotency.EventKind{idempotency.EventExecuted, idempotency.EventReplayed} {
			if got[kind] != "POST /payments/{id}" {
				t.Fatalf("wrapMux=%v: %v event's route %q", wrapMux, kind, got[kind])
			}
		}
	}
}

func newPost(path, key string) *http.Request {
	req := httptest.NewRequest(http.MethodPost, path, nil)
	req.Header.Set("Idempotency-Key", key)
	return req
}

func newRecorder() *httptest.ResponseRecorder { return httptest.NewRecorder() }

type requestIDKey struct{}

// ctxHandler is a slog.Handler that records a context value of every record.
type ctxHandler struct {
	mu  *sync.Mutex
	ids *[]any
}

func (h ctxHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h ctxHandler) Handle(ctx context.Context, _ slog.Record) error {
	h.mu.Lock()
	*h.ids = append(*h.ids, ctx.Value(requestIDKey{}))
	h.mu.Unlock()
	return nil
}
func (h ctxHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h ctxHandler) WithGroup(string) slog.Handler      { return h }

// TestObserverAndLoggerGetRequestContext: events and log records carry the
// request's context, so a trace or request id set before the middleware
// reaches metrics and logs.
func TestObserverAndLoggerGetRequestContext(t *testing.T) {
	var mu sync.Mutex
	var observed, logged []any
	mw := idempotency.New(newMemStore(t),
		idempotency.WithObserver(func(ctx context.Context, e idempotency.Event) {
			if !e.Final {
				return
			}
			mu.Lock()
			observed = append(observed, ctx.Value(requestIDKey{}))
			mu.Unlock()
		}),
		idempotency.WithLogger(slog.New(ctxHandler{&mu, &logged})))
	h := mw(&counter{})
	for i := 0; i < 2; i++ {
		req := newPost("/p", "k")
		req = req.WithContext(context.WithValue(req.Context(), requestIDKey{}, "req-7"))
		h.ServeHTTP(newRecorder(), req)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(observed) != 2 || len(logged) != 3 {
		t.Fatalf("%d outcomes, %d log records; want 2 and 3 (started, executed, replayed)", len(observed), len(logged))
	}
	for _, v := range append(observed, logged...) {
		if v != "req-7" {
			t.Fatalf("context value %v, want the request's", v)
		}
	}
}

// TestOneOutcomePerRequest: every covered request reports exactly one event
// with Final set, whatever happens to it, and it has Ran exactly
// when Started came before it; 64 goroutines send a mix of requests.
func TestOneOutcomePerRequest(t *testing.T) {
	var mu sync.Mutex
	outcomes := map[any]int{}
	started := map[any]bool{}
	ranMismatch := 0
	mw := idempotency.New(newMemStore(t), idempotency.WithMaxRequestBody(16), idempotency.WithObserver(func(ctx context.Context, e idempotency.Event) {
		id := ctx.Value(requestIDKey{})
		mu.Lock()
		defer mu.Unlock()
		switch {
		case e.Kind == idempotency.EventStarted:
			started[id] = true
		case e.Final:
			outcomes[id]++
			if e.Ran != started[id] {
				ranMismatch++
			}
		}
	}))
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/fail":
			w.WriteHeader(http.StatusBadGateway)
		case "/panic":
			panic(http.ErrAbortHandler)
		default:
			w.WriteHeader(http.StatusCreated)
		}
	}))
	paths := []string{"/ok", "/fail", "/panic"}
	var wg sync.WaitGroup
	const n = 64
	for g := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				key := fmt.Sprint("k", (g+i)%7)
				body := ""
				if i%5 == 0 {
					body = "a body over the sixteen byte cap"
				}
				if i%11 == 0 {
					key = `"bad`
				}
				req := httptest.NewRequest(http.MethodPost, paths[(g+i)%3], strings.NewReader(body))
				req.Header.Set("Idempotency-Key", key)
				req = req.WithContext(context.WithValue(req.Context(), requestIDKey{}, [2]int{g, i}))
				func() {
					defer func() { _ = recover() }()
					h.ServeHTTP(httptest.NewRecorder(), req)
				}()
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(outcomes) != n*20 {
		t.Fatalf("%d requests reported an outcome, want %d", len(outcomes), n*20)
	}
	for id, c := range outcomes {
		if c != 1 {
			t.Fatalf("request %v reported %d outcomes", id, c)
		}
	}
	if ranMismatch != 0 {
		t.Fatalf("%d outcomes whose Ran disagrees with Started", ranMismatch)
	}
}
