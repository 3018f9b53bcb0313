package idemotel_test

import (
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/memstore"
)

// failingStore is a store whose Acquire fails with err.
type failingStore struct {
	idempotency.Store
	err error
}

func (s failingStore) Acquire(context.Context, idempotency.AcquireRequest) (idempotency.Acquisition, error) {
	return idempotency.Acquisition{}, s.err
}

var errDown = errors.New("dial tcp 127.0.0.1:6379: connection refused")

// txMem is a TxStore over memstore: its transactions complete the record
// at commit and hold nothing else.
type txMem struct{ *memstore.Store }

const txHandle = "the transaction's handle"

func (s txMem) BeginTx(_ context.Context, key, token string) (idempotency.Tx, error) {
	return &memTx{store: s.Store, key: key, token: token}, nil
}

type memTx struct {
	store      *memstore.Store
	key, token string
}

func (t *memTx) Handle() any { return txHandle }

func (t *memTx) Complete(ctx context.Context, resp *idempotency.Response, ttl time.Duration) error {
	return t.store.Complete(ctx, t.key, t.token, resp, ttl)
}

func (t *memTx) Rollback(context.Context) error { return nil }

// signal wakes the goroutines waiting for a condition each time the
// condition may have changed.
type signal struct {
	mu      sync.Mutex
	changed *sync.Cond
}

func newSignal() *signal {
	s := &signal{}
	s.changed = sync.NewCond(&s.mu)
	return s
}

// notify wakes the waiters to check their condition again.
func (s *signal) notify() {
	s.mu.Lock()
	s.changed.Broadcast()
	s.mu.Unlock()
}

// wait waits until cond holds, checking it again on each notify, for 5
// seconds at most; it reports whether cond held.
func (s *signal) wait(cond func() bool) bool {
	expired := false
	timer := time.AfterFunc(5*time.Second, func() {
		s.mu.Lock()
		expired = true
		s.changed.Broadcast()
		s.mu.Unlock()
	})
	defer timer.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for !cond() {
		if expired {
			return false
		}
		s.changed.Wait()
	}
	return true
}

// await waits as wait does and fails the test when cond did not hold in
// time.
func (s *signal) await(t *testing.T, cond func() bool, format string, args ...any) {
	t.Helper()
	if !s.wait(cond) {
		t.Fatalf("timed out waiting for "+format, args...)
	}
}

// finals wraps an observer and counts the final events it passed on: a
// response reaches the client before the record is stored and the outcome
// reported, so the test waits for the outcome, not the response.
type finals struct {
	mu       sync.Mutex
	n        int
	reported *signal
}

func newFinals() *finals { return &finals{reported: newSignal()} }

func (f *finals) wrap(observe func(context.Context, idempotency.Event)) func(context.Context, idempotency.Event) {
	return func(ctx context.Context, e idempotency.Event) {
		observe(ctx, e)
		if e.Final {
			f.mu.Lock()
			f.n++
			f.mu.Unlock()
			f.reported.notify()
		}
	}
}

// await waits until n final events were reported.
func (f *finals) await(t *testing.T, n int) {
	t.Helper()
	f.reported.await(t, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.n >= n
	}, "%d final events", n)
}

// recorder is the SDK's in-memory span recorder, notifying ended each time
// a span ends.
type recorder struct {
	*tracetest.SpanRecorder
	ended *signal
}

func newRecorder() recorder {
	return recorder{SpanRecorder: tracetest.NewSpanRecorder(), ended: newSignal()}
}

func (r recorder) OnEnd(s sdktrace.ReadOnlySpan) {
	r.SpanRecorder.OnEnd(s)
	r.ended.notify()
}

// gate holds the handlers of requests that carry X-Block until released.
type gate struct {
	entered chan struct{}
	release chan struct{}
}

func newGate() *gate {
	return &gate{entered: make(chan struct{}, 8), release: make(chan struct{}, 8)}
}

func (g *gate) handler(status int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Block") != "" {
			g.entered <- struct{}{}
			<-g.release
		}
		w.WriteHeader(status)
		io.WriteString(w, `{"ok":true}`)
	})
}

func (g *gate) awaitEntered(t *testing.T) {
	t.Helper()
	select {
	case <-g.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the handler did not start")
	}
}

// traced is a server whose outer handler starts a span for each request,
// named by the request's X-Name header, before the routes see it.
type traced struct {
	*httptest.Server
	tp       *sdktrace.TracerProvider
	recorder recorder

	mu      sync.Mutex
	parents map[string]trace.SpanContext // by X-Name
}

func newTraced(t *testing.T, mux func(s *traced) http.Handler) *traced {
	sr := newRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	s := &traced{tp: tp, recorder: sr, parents: map[string]trace.SpanContext{}}
	routes := mux(s)
	tracer := tp.Tracer("test")
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, span := tracer.Start(r.Context(), "request")
		defer span.End()
		s.mu.Lock()
		s.parents[r.Header.Get("X-Name")] = span.SpanContext()
		s.mu.Unlock()
		routes.ServeHTTP(w, r.WithContext(ctx))
	}))
	s.Config.ErrorLog = log.New(io.Discard, "", 0) // a panicking handler's stack
	s.Start()
	t.Cleanup(s.Close)
	return s
}

// parent returns the span the outer handler started for the request named
// name.
func (s *traced) parent(t *testing.T, name string) trace.SpanContext {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	sc, ok := s.parents[name]
	if !ok {
		t.Fatalf("no request named %q", name)
	}
	return sc
}

// children returns the ended spans whose parent is the request named
// name's span, in the order they ended; none while that request has not
// arrived.
func (s *traced) children(t *testing.T, name string) []sdktrace.ReadOnlySpan {
	t.Helper()
	s.mu.Lock()
	parent, ok := s.parents[name]
	s.mu.Unlock()
	if !ok {
		return nil
	}
	var out []sdktrace.ReadOnlySpan
	for _, sp := range s.recorder.Ended() {
		if sp.Parent().SpanID() == parent.SpanID() {
			if sp.SpanContext().TraceID() != parent.TraceID() {
				t.Errorf("%s: trace %s, its parent's %s", sp.Name(), sp.SpanContext().TraceID(), parent.TraceID())
			}
			out = append(out, sp)
		}
	}
	return out
}

// client sends every request on a connection of its own: net/http's
// transport resends a request with an Idempotency-Key whose reused
// connection broke (as a panicking handler's does).
var client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

type req struct {
	name, path, key, body string
	block                 bool
}

// post sends r and returns the status, or 0 when no response came (the
// handler panicked).
func post(t *testing.T, base string, r req) int {
	t.Helper()
	hr, err := http.NewRequest(http.MethodPost, base+r.path, strings.NewReader(r.body))
	if err != nil {
		t.Fatal(err)
	}
	hr.Header.Set("X-Name", r.name)
	if r.key != "" {
		hr.Header.Set(idempotency.HeaderKey, r.key)
	}
	if r.block {
		hr.Header.Set("X-Block", "1")
	}
	resp, err := client.Do(hr)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}
