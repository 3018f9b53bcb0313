package idemotel_test

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/go-idempotency/idempotency"
	idemotel "github.com/go-idempotency/idempotency/adapters/otel"
	"github.com/go-idempotency/idempotency/internal/fakeclock"
	"github.com/go-idempotency/idempotency/memstore"
)

// collect returns the metrics reader holds, by name.
func collect(t *testing.T, reader sdkmetric.Reader) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

func key(set attribute.Set) string { return set.Encoded(attribute.DefaultEncoder()) }

// points returns the data points of the metric name: for each attribute
// set, a sum's or a gauge's value or a histogram's count.
func points(t *testing.T, reader sdkmetric.Reader, name string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	m, ok := collect(t, reader)[name]
	if !ok {
		return out
	}
	switch data := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range data.DataPoints {
			out[key(p.Attributes)] = float64(p.Value)
		}
	case metricdata.Histogram[float64]:
		for _, p := range data.DataPoints {
			out[key(p.Attributes)] = float64(p.Count)
		}
	case metricdata.Gauge[float64]:
		for _, p := range data.DataPoints {
			out[key(p.Attributes)] = p.Value
		}
	default:
		t.Fatalf("%s: unexpected data %T", name, m.Data)
	}
	return out
}

func expectPoints(t *testing.T, reader sdkmetric.Reader, name string, want map[string]float64) {
	t.Helper()
	if got := points(t, reader, name); !reflect.DeepEqual(got, want) {
		t.Errorf("%s:\n got  %v\n want %v", name, got, want)
	}
}

// attributeValues returns the values of every attribute of m's data
// points and of their exemplars.
func attributeValues(m metricdata.Metrics) []string {
	var sets []attribute.Set
	var filtered []attribute.KeyValue
	switch data := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range data.DataPoints {
			sets = append(sets, p.Attributes)
			for _, ex := range p.Exemplars {
				filtered = append(filtered, ex.FilteredAttributes...)
			}
		}
	case metricdata.Histogram[float64]:
		for _, p := range data.DataPoints {
			sets = append(sets, p.Attributes)
			for _, ex := range p.Exemplars {
				filtered = append(filtered, ex.FilteredAttributes...)
			}
		}
	case metricdata.Gauge[float64]:
		for _, p := range data.DataPoints {
			sets = append(sets, p.Attributes)
			for _, ex := range p.Exemplars {
				filtered = append(filtered, ex.FilteredAttributes...)
			}
		}
	}
	var out []string
	for _, set := range sets {
		filtered = append(filtered, set.ToSlice()...)
	}
	for _, kv := range filtered {
		out = append(out, string(kv.Key)+"="+kv.Value.Emit())
	}
	return out
}

func outcome(route, outcome string) string {
	return "http.request.method=POST,http.route=POST " + route + ",idempotency.outcome=" + outcome
}

func errType(route, kind string) string {
	return "error.type=" + kind + ",http.request.method=POST,http.route=POST " + route
}

func running(route string) string { return "http.request.method=POST,http.route=POST " + route }

// TestMetrics drives the real middleware over HTTP through every outcome
// and checks each instrument's data points, that no attribute carries a
// client's key, a storage key or a body, and that measurements carry the
// request's trace as exemplars.
func TestMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	f := newFinals()
	observe := f.wrap(idemotel.Observer(idemotel.WithMeterProvider(mp)))

	clk := fakeclock.New(time.Unix(1_700_000_000, 0))
	store := memstore.New(memstore.WithClock(clk.Now))
	defer store.Close()
	g := newGate()
	srv := newTraced(t, func(*traced) http.Handler {
		mw := idempotency.New(store, idempotency.WithObserver(observe))
		mux := http.NewServeMux()
		mux.Handle("POST /charges", mw(g.handler(http.StatusCreated)))
		mux.Handle("POST /slow", mw(g.handler(http.StatusCreated)))
		mux.Handle("POST /fail", mw(g.handler(http.StatusBadGateway)))
		mux.Handle("POST /panic", mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") })))
		mux.Handle("POST /down", idempotency.New(failingStore{store, errDown}, idempotency.WithObserver(observe))(g.handler(http.StatusCreated)))
		mux.Handle("POST /open", idempotency.New(failingStore{store, errDown}, idempotency.WithObserver(observe), idempotency.WithFailOpen(true))(g.handler(http.StatusCreated)))
		mux.Handle("POST /steal", mw(g.handler(http.StatusCreated)))
		return mux
	})
	t.Cleanup(func() { close(g.release) }) // before the server closes, should the test fail with a handler held

	n := 0
	step := func(r req, want int) {
		t.Helper()
		if got := post(t, srv.URL, r); got != want {
			t.Fatalf("%s: status %d, want %d", r.name, got, want)
		}
		n++
		f.await(t, n)
	}
	step(req{name: "first", path: "/charges", key: "raw-key-1", body: "secret-body-a"}, http.StatusCreated)
	step(req{name: "replay", path: "/charges", key: "raw-key-1", body: "secret-body-a"}, http.StatusCreated)
	step(req{name: "mismatch", path: "/charges", key: "raw-key-1", body: "secret-body-b"}, http.StatusUnprocessableEntity)
	step(req{name: "invalid", path: "/charges", key: strings.Repeat("k", 300)}, http.StatusBadRequest)
	step(req{name: "fail", path: "/fail", key: "raw-key-2"}, http.StatusBadGateway)
	step(req{name: "panic", path: "/panic", key: "raw-key-3"}, 0)
	step(req{name: "down", path: "/down", key: "raw-key-4"}, http.StatusServiceUnavailable)
	step(req{name: "open", path: "/open", key: "raw-key-5"}, http.StatusCreated)

	// Conflict: a duplicate while the original runs.
	first := make(chan int, 1)
	go func() { first <- post(t, srv.URL, req{name: "original", path: "/slow", key: "raw-key-6", block: true}) }()
	g.awaitEntered(t)
	if got := points(t, reader, "idempotency.handlers.running")[running("/slow")]; got != 1 {
		t.Errorf("running /slow while the original runs: %v, want 1", got)
	}
	step(req{name: "conflict", path: "/slow", key: "raw-key-6"}, http.StatusConflict)
	g.release <- struct{}{}
	if got := <-first; got != http.StatusCreated {
		t.Fatalf("original: status %d", got)
	}
	n++
	f.await(t, n)

	// Steal: the owner's lease expires on the store's clock while its
	// handler still runs; a duplicate takes the record over and completes
	// it, and the owner's completion is refused.
	go func() {
		first <- post(t, srv.URL, req{name: "owner", path: "/steal", key: "raw-key-7", body: "secret-body-s", block: true})
	}()
	g.awaitEntered(t)
	clk.Advance(11 * time.Second) // past the default 10s lease
	step(req{name: "thief", path: "/steal", key: "raw-key-7", body: "secret-body-s"}, http.StatusCreated)
	if got := points(t, reader, "idempotency.handlers.running")[running("/steal")]; got != 1 {
		t.Errorf("running /steal with the old owner still running: %v, want 1", got)
	}
	g.release <- struct{}{}
	if got := <-first; got != http.StatusCreated {
		t.Fatalf("old owner: status %d", got)
	}
	n++
	f.await(t, n)

	outcomes := map[string]float64{
		outcome("/charges", "executed"): 1,
		outcome("/charges", "replayed"): 1,
		outcome("/charges", "mismatch"): 1,
		outcome("/charges", "rejected"): 1,
		outcome("/fail", "released"):    1,
		outcome("/panic", "released"):   1,
		outcome("/down", "store_error"): 1,
		outcome("/open", "failed_open"): 1,
		outcome("/slow", "conflict"):    1,
		outcome("/slow", "executed"):    1,
		outcome("/steal", "executed"):   1,
		outcome("/steal", "lease_lost"): 1,
	}
	durations := map[string]float64{}
	for k, v := range outcomes {
		durations[k] = v
	}
	outcomes[outcome("/steal", "stolen")] = 1
	expectPoints(t, reader, "idempotency.requests", outcomes)
	expectPoints(t, reader, "idempotency.request.duration", durations)
	expectPoints(t, reader, "idempotency.errors", map[string]float64{
		errType("/down", "store_error"): 1,
		errType("/open", "store_error"): 1,
		errType("/steal", "lease_lost"): 1,
	})
	expectPoints(t, reader, "idempotency.handlers.running", map[string]float64{
		running("/charges"): 0, running("/fail"): 0, running("/panic"): 0, running("/slow"): 0, running("/steal"): 0,
	})

	// No attribute of any data point or exemplar carries a client's key, a
	// storage key or a body.
	secrets := []string{"raw-key", "secret-body", `"ok":true`, strings.Repeat("k", 64)}
	for i := 1; i <= 7; i++ {
		secrets = append(secrets, idempotency.StorageKey("", fmt.Sprintf("raw-key-%d", i)))
	}
	for name, m := range collect(t, reader) {
		for _, v := range attributeValues(m) {
			for _, secret := range secrets {
				if strings.Contains(v, secret) {
					t.Errorf("%s: attribute value %q carries %q", name, v, secret)
				}
			}
		}
	}

	// The measurements were made with the request's context: the SDK's
	// exemplars carry the request's trace.
	m := collect(t, reader)["idempotency.request.duration"]
	if m.Unit != "s" {
		t.Errorf("duration unit %q, want s", m.Unit)
	}
	want := srv.parent(t, "first").TraceID()
	found := false
	for _, p := range m.Data.(metricdata.Histogram[float64]).DataPoints {
		if key(p.Attributes) != outcome("/charges", "executed") {
			continue
		}
		for _, ex := range p.Exemplars {
			found = found || bytes.Equal(ex.TraceID, want[:])
		}
	}
	if !found {
		t.Errorf("no exemplar of the first request's trace %s", want)
	}
}

// TestRunningFollowsStarted checks that the up-down counter takes a handler
// off with the attributes it added it with when the route named by the
// final event differs from the one Started named: a router beneath the
// middleware sets its pattern on the request while the handler runs.
func TestRunningFollowsStarted(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	store := memstore.New()
	defer store.Close()
	g := newGate()
	routed := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Pattern = "POST /routed" // as chi does, beneath a middleware mounted with r.Use
		g.handler(http.StatusCreated).ServeHTTP(w, r)
	})
	h := idempotency.New(store, idempotency.WithObserver(idemotel.Observer(idemotel.WithMeterProvider(mp))))(routed)

	done := make(chan struct{})
	go func() {
		defer close(done)
		r, _ := http.NewRequest(http.MethodPost, "/routed", nil)
		r.Header.Set(idempotency.HeaderKey, "k")
		r.Header.Set("X-Block", "1")
		h.ServeHTTP(discard{}, r)
	}()
	g.awaitEntered(t)
	expectPoints(t, reader, "idempotency.handlers.running", map[string]float64{"http.request.method=POST,http.route=": 1})
	g.release <- struct{}{}
	<-done // ServeHTTP returns after the outcome was reported
	expectPoints(t, reader, "idempotency.handlers.running", map[string]float64{"http.request.method=POST,http.route=": 0})
	expectPoints(t, reader, "idempotency.requests", map[string]float64{outcome("/routed", "executed"): 1})
}

type discard struct{}

func (discard) Header() http.Header         { return http.Header{} }
func (discard) Write(b []byte) (int, error) { return len(b), nil }
func (discard) WriteHeader(int)             {}

// TestBuckets checks that WithBuckets sets the histogram's boundaries.
func TestBuckets(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	observe := idemotel.Observer(idemotel.WithMeterProvider(mp), idemotel.WithBuckets(0.5, 1, 2))
	observe(context.Background(), idempotency.Event{Kind: idempotency.EventReplayed, Route: "POST /p", Method: "POST",
		Duration: 700 * time.Millisecond, Final: true})
	p := collect(t, reader)["idempotency.request.duration"].Data.(metricdata.Histogram[float64]).DataPoints[0]
	if !reflect.DeepEqual(p.Bounds, []float64{0.5, 1, 2}) || !reflect.DeepEqual(p.BucketCounts, []uint64{0, 1, 0, 0}) {
		t.Errorf("bounds %v with counts %v, want [0.5 1 2] with [0 1 0 0]", p.Bounds, p.BucketCounts)
	}

	reader = sdkmetric.NewManualReader()
	observe = idemotel.Observer(idemotel.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	observe(context.Background(), idempotency.Event{Kind: idempotency.EventReplayed, Final: true})
	p = collect(t, reader)["idempotency.request.duration"].Data.(metricdata.Histogram[float64]).DataPoints[0]
	if !reflect.DeepEqual(p.Bounds, idemotel.DefaultBuckets) {
		t.Errorf("default bounds %v, want %v", p.Bounds, idemotel.DefaultBuckets)
	}
}

// TestMisconfigurationPanics checks that every misconfiguration panics at
// construction.
func TestMisconfigurationPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"nil store":            func() { idemotel.Store(nil) },
		"nil meter provider":   func() { idemotel.WithMeterProvider(nil) },
		"nil tracer provider":  func() { idemotel.WithTracerProvider(nil) },
		"no buckets":           func() { idemotel.WithBuckets() },
		"unsorted buckets":     func() { idemotel.WithBuckets(1, 0.5) },
		"infinite bucket":      func() { idemotel.WithBuckets(1, math.Inf(1)) },
		"nil sink":             func() { idemotel.Sink(nil) },
		"nil propagator":       func() { idemotel.WithPropagator(nil) },
		"nil topic pattern":    func() { idemotel.WithTopicPattern(nil) },
		"no age buckets":       func() { idemotel.WithAgeBuckets() },
		"unsorted age buckets": func() { idemotel.WithAgeBuckets(60, 1) },
		"infinite age bucket":  func() { idemotel.WithAgeBuckets(1, math.Inf(1)) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("no panic")
				}
			}()
			f()
		})
	}
}
