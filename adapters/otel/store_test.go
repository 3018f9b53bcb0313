package idemotel_test

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/go-idempotency/idempotency"
	idemotel "github.com/go-idempotency/idempotency/adapters/otel"
	"github.com/go-idempotency/idempotency/memstore"
	"github.com/go-idempotency/idempotency/storetest"
)

func names(spans []sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name())
	}
	return out
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	out := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		out[kv.Key] = kv.Value
	}
	return out
}

// awaitChildren waits until n spans whose parent is the request named
// name's span have ended, and returns them.
func (s *traced) awaitChildren(t *testing.T, name string, n int) []sdktrace.ReadOnlySpan {
	t.Helper()
	var spans []sdktrace.ReadOnlySpan
	s.recorder.ended.await(t, func() bool {
		spans = s.children(t, name)
		return len(spans) >= n
	}, "%d spans of %s", n, name)
	return spans
}

func expectNames(t *testing.T, request string, spans []sdktrace.ReadOnlySpan, want ...string) {
	t.Helper()
	if got := names(spans); !reflect.DeepEqual(got, want) {
		t.Errorf("%s: spans %v, want %v", request, got, want)
	}
}

func expectAttr(t *testing.T, s sdktrace.ReadOnlySpan, key attribute.Key, want any) {
	t.Helper()
	got, ok := attrs(s)[key]
	if !ok {
		t.Errorf("%s: no %s, want %v", s.Name(), key, want)
		return
	}
	if got.AsInterface() != want {
		t.Errorf("%s: %s = %v, want %v", s.Name(), key, got.AsInterface(), want)
	}
}

// TestSpans drives the real middleware over HTTP, behind an outer handler
// that starts each request's span, and checks the store spans: their
// names, attributes and parent.
func TestSpans(t *testing.T) {
	mem := memstore.New()
	defer mem.Close()
	g := newGate()
	srv := newTraced(t, func(s *traced) http.Handler {
		tp := idemotel.WithTracerProvider(s.tp)
		store := idemotel.Store(mem, tp)
		mw := idempotency.New(store)
		mux := http.NewServeMux()
		mux.Handle("POST /charges", mw(g.handler(http.StatusCreated)))
		mux.Handle("POST /fail", mw(g.handler(http.StatusBadGateway)))
		mux.Handle("POST /wait", idempotency.New(store, idempotency.WithWait(5*time.Second))(g.handler(http.StatusCreated)))
		// The handler runs until its lease was extended at least once.
		mux.Handle("POST /slow", idempotency.New(store, idempotency.WithLease(300*time.Millisecond))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			extended := s.recorder.ended.wait(func() bool {
				return slices.Contains(names(s.recorder.Ended()), idemotel.SpanExtend)
			})
			if !extended {
				http.Error(w, "the lease was not extended", http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
		})))
		mux.Handle("POST /down", idempotency.New(idemotel.Store(failingStore{mem, errDown}, tp))(g.handler(http.StatusCreated)))
		mux.Handle("POST /full", idempotency.New(idemotel.Store(failingStore{mem, idempotency.ErrStoreFull}, tp))(g.handler(http.StatusCreated)))
		txs := idemotel.Store(txMem{mem}, tp)
		mux.Handle("POST /tx", idempotency.New(txs, idempotency.WithTransaction(true))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if info, _ := idempotency.FromContext(r.Context()); info.Tx != txHandle {
				http.Error(w, "the transaction's handle did not reach the handler", http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
		})))
		mux.Handle("POST /txfail", idempotency.New(txs, idempotency.WithTransaction(true))(g.handler(http.StatusInternalServerError)))
		mux.Handle("POST /keyhash", idempotency.New(idemotel.Store(mem, tp, idemotel.WithKeyHash(true)))(g.handler(http.StatusCreated)))
		return mux
	})
	t.Cleanup(func() { close(g.release) }) // before the server closes, should the test fail with a handler held
	do := func(r req, want int) {
		t.Helper()
		if got := post(t, srv.URL, r); got != want {
			t.Fatalf("%s: status %d, want %d", r.name, got, want)
		}
	}

	do(req{name: "first", path: "/charges", key: "raw-key-1", body: "secret-body"}, http.StatusCreated)
	spans := srv.awaitChildren(t, "first", 2)
	expectNames(t, "first", spans, idemotel.SpanAcquire, idemotel.SpanComplete)
	expectAttr(t, spans[0], idemotel.AcquireOutcomeKey, "acquired")
	expectAttr(t, spans[0], idemotel.EpochKey, int64(1))
	expectAttr(t, spans[1], idemotel.ResponseStatusKey, int64(http.StatusCreated))
	expectAttr(t, spans[1], idemotel.ResponseSizeKey, int64(len(`{"ok":true}`)))

	do(req{name: "replay", path: "/charges", key: "raw-key-1", body: "secret-body"}, http.StatusCreated)
	spans = srv.awaitChildren(t, "replay", 1)
	expectNames(t, "replay", spans, idemotel.SpanAcquire)
	expectAttr(t, spans[0], idemotel.AcquireOutcomeKey, "completed")

	do(req{name: "mismatch", path: "/charges", key: "raw-key-1", body: "secret-body-2"}, http.StatusUnprocessableEntity)
	spans = srv.awaitChildren(t, "mismatch", 1)
	expectAttr(t, spans[0], idemotel.AcquireOutcomeKey, "mismatch")

	do(req{name: "fail", path: "/fail", key: "raw-key-2"}, http.StatusBadGateway)
	expectNames(t, "fail", srv.awaitChildren(t, "fail", 2), idemotel.SpanAcquire, idemotel.SpanRelease)

	do(req{name: "slow", path: "/slow", key: "raw-key-3"}, http.StatusCreated)
	spans = srv.awaitChildren(t, "slow", 3)
	if n := names(spans); n[0] != idemotel.SpanAcquire || n[1] != idemotel.SpanExtend {
		t.Errorf("slow: spans %v, want acquire, extend...", n)
	}
	srv.recorder.ended.await(t, func() bool {
		n := names(srv.children(t, "slow"))
		return n[len(n)-1] == idemotel.SpanComplete
	}, "the complete of slow")

	// Wait mode: the duplicate watches the record and is notified when the
	// original completes.
	first := make(chan int, 1)
	go func() { first <- post(t, srv.URL, req{name: "original", path: "/wait", key: "raw-key-4", block: true}) }()
	g.awaitEntered(t)
	go func() { first <- post(t, srv.URL, req{name: "waiter", path: "/wait", key: "raw-key-4"}) }()
	// The waiter's first acquire, and the one after its first Watch, found
	// the original in flight: it now waits for the notification.
	srv.awaitChildren(t, "waiter", 2)
	g.release <- struct{}{}
	for range 2 {
		if got := <-first; got != http.StatusCreated {
			t.Fatalf("wait: status %d", got)
		}
	}
	spans = srv.awaitChildren(t, "waiter", 5) // acquire, acquire, wait (notified), acquire, wait
	var notified bool
	var acquires []string
	for _, s := range spans {
		switch s.Name() {
		case idemotel.SpanWait:
			if v, ok := attrs(s)[idemotel.NotifiedKey]; !ok {
				t.Errorf("wait span without %s", idemotel.NotifiedKey)
			} else if v.AsBool() {
				notified = true
			}
		case idemotel.SpanAcquire:
			acquires = append(acquires, attrs(s)[idemotel.AcquireOutcomeKey].AsString())
		default:
			t.Errorf("waiter: unexpected span %s", s.Name())
		}
	}
	if !notified {
		t.Errorf("waiter: no wait span was notified: %v", names(spans))
	}
	if want := []string{"in_flight", "in_flight", "completed"}; !reflect.DeepEqual(acquires, want) {
		t.Errorf("waiter: acquire outcomes %v, want %v", acquires, want)
	}

	do(req{name: "down", path: "/down", key: "raw-key-5"}, http.StatusServiceUnavailable)
	spans = srv.awaitChildren(t, "down", 1)
	expectNames(t, "down", spans, idemotel.SpanAcquire)
	if st := spans[0].Status(); st.Code != codes.Error || st.Description != errDown.Error() {
		t.Errorf("down: status %v, want Error %q", st, errDown)
	}
	expectAttr(t, spans[0], idemotel.ErrorTypeKey, "_OTHER")
	if ev := spans[0].Events(); len(ev) != 1 || ev[0].Name != "exception" {
		t.Errorf("down: events %v, want the recorded error", ev)
	}

	do(req{name: "full", path: "/full", key: "raw-key-6"}, http.StatusServiceUnavailable)
	expectAttr(t, srv.awaitChildren(t, "full", 1)[0], idemotel.ErrorTypeKey, "store_full")

	do(req{name: "tx", path: "/tx", key: "raw-key-7"}, http.StatusCreated)
	spans = srv.awaitChildren(t, "tx", 3)
	expectNames(t, "tx", spans, idemotel.SpanAcquire, idemotel.SpanBegin, idemotel.SpanCommit)
	expectAttr(t, spans[2], idemotel.ResponseStatusKey, int64(http.StatusCreated))

	do(req{name: "txfail", path: "/txfail", key: "raw-key-8"}, http.StatusInternalServerError)
	expectNames(t, "txfail", srv.awaitChildren(t, "txfail", 4),
		idemotel.SpanAcquire, idemotel.SpanBegin, idemotel.SpanRollback, idemotel.SpanRelease)

	do(req{name: "keyhash", path: "/keyhash", key: "raw-key-9"}, http.StatusCreated)
	for _, s := range srv.awaitChildren(t, "keyhash", 2) {
		expectAttr(t, s, idemotel.KeyHashKey, idempotency.StorageKey("", "raw-key-9"))
	}

	// Only WithKeyHash adds the storage key, and no span carries the
	// client's key or a body.
	for _, s := range srv.recorder.Ended() {
		keyhash := s.Parent().SpanID() == srv.parent(t, "keyhash").SpanID()
		if _, ok := attrs(s)[idemotel.KeyHashKey]; ok != keyhash {
			t.Errorf("%s: %s present: %v", s.Name(), idemotel.KeyHashKey, ok)
		}
		all := append([]attribute.KeyValue(nil), s.Attributes()...)
		for _, ev := range s.Events() {
			all = append(all, ev.Attributes...)
		}
		for _, kv := range all {
			if v := kv.Value.Emit(); strings.Contains(v, "raw-key") || strings.Contains(v, "secret-body") || strings.Contains(v, `"ok":true`) {
				t.Errorf("%s: %s = %q carries a client key or a body", s.Name(), kv.Key, v)
			}
		}
	}
}

// TestTxStorePreserved checks that Store returns a TxStore exactly when it
// wraps one, so that New's WithTransaction check still holds.
func TestTxStorePreserved(t *testing.T) {
	mem := memstore.New()
	defer mem.Close()
	if _, ok := idemotel.Store(mem).(idempotency.TxStore); ok {
		t.Error("a wrapped memstore is a TxStore")
	}
	if _, ok := idemotel.Store(txMem{mem}).(idempotency.TxStore); !ok {
		t.Error("a wrapped TxStore is not a TxStore")
	}
	defer func() {
		if recover() == nil {
			t.Error("New with WithTransaction accepted a wrapped memstore")
		}
	}()
	idempotency.New(idemotel.Store(mem), idempotency.WithTransaction(true))
}

// watchFails is a store whose Watch fails.
type watchFails struct{ idempotency.Store }

func (watchFails) Watch(context.Context, string) (<-chan struct{}, func(), error) {
	return nil, nil, idempotency.ErrStoreClosed
}

// TestDirectCalls calls the wrapped store itself: the span of each call is
// a child of the span in the call's context, a failed Watch ends its span
// at once, and a Watch that was not notified says so.
func TestDirectCalls(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	mem := memstore.New()
	defer mem.Close()
	ctx, parent := tp.Tracer("test").Start(context.Background(), "parent")
	defer parent.End()

	s := idemotel.Store(mem, idemotel.WithTracerProvider(tp))
	_, stop, err := s.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if err := s.Extend(ctx, "k", "t", time.Second); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("Extend of no record: %v", err)
	}
	if _, _, err := idemotel.Store(watchFails{mem}, idemotel.WithTracerProvider(tp)).Watch(ctx, "k"); err == nil {
		t.Fatal("Watch did not fail")
	}

	spans := sr.Ended()
	expectNames(t, "direct", spans, idemotel.SpanWait, idemotel.SpanExtend, idemotel.SpanWait)
	for _, s := range spans {
		if s.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Errorf("%s: parent %s, want %s", s.Name(), s.Parent().SpanID(), parent.SpanContext().SpanID())
		}
	}
	expectAttr(t, spans[0], idemotel.NotifiedKey, false)
	expectAttr(t, spans[1], idemotel.ErrorTypeKey, "lease_lost")
	expectAttr(t, spans[2], idemotel.ErrorTypeKey, "store_closed")
}

func TestErrorType(t *testing.T) {
	for err, want := range map[error]string{
		idempotency.ErrLeaseLost: "lease_lost",
		idempotency.ErrStoreFull: "store_full",
		errors.Join(errors.New("decode"), idempotency.ErrCorruptRecord): "corrupt_record",
		idempotency.ErrStoreClosed:                                      "store_closed",
		context.DeadlineExceeded:                                        "deadline_exceeded",
		context.Canceled:                                                "canceled",
		errDown:                                                         "_OTHER",
	} {
		if got := idemotel.ErrorType(err); got != want {
			t.Errorf("ErrorType(%v) = %q, want %q", err, got, want)
		}
	}
}

// TestConformance runs the store conformance suite against a wrapped
// memstore: the wrapper changes no answer, and Watch notifies through it.
func TestConformance(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	storetest.Run(t, func(t *testing.T) idempotency.Store {
		mem := memstore.New()
		t.Cleanup(func() { mem.Close() })
		return idemotel.Store(mem, idemotel.WithTracerProvider(tp))
	})
	t.Cleanup(func() {
		if len(sr.Ended()) == 0 {
			t.Error("the suite's calls made no spans")
		}
	})
}
