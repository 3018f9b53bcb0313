package idemprom_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/go-idempotency/idempotency"
	idemprom "github.com/go-idempotency/idempotency/adapters/prometheus"
	"github.com/go-idempotency/idempotency/internal/fakeclock"
	"github.com/go-idempotency/idempotency/memstore"
)

// downStore is a store that cannot be reached: every Acquire fails.
type downStore struct{ idempotency.Store }

func (downStore) Acquire(context.Context, idempotency.AcquireRequest) (idempotency.Acquisition, error) {
	return idempotency.Acquisition{}, errors.New("dial tcp 127.0.0.1:6379: connection refused")
}

// finals wraps an observer and counts the final events it passed on: a
// response reaches the client before the record is stored and the outcome
// reported, so the test waits for the outcome, not the response.
type finals struct {
	mu      sync.Mutex
	changed *sync.Cond
	n       int
}

func newFinals() *finals {
	f := &finals{}
	f.changed = sync.NewCond(&f.mu)
	return f
}

func (f *finals) wrap(observe func(context.Context, idempotency.Event)) func(context.Context, idempotency.Event) {
	return func(ctx context.Context, e idempotency.Event) {
		observe(ctx, e)
		if e.Final {
			f.mu.Lock()
			f.n++
			f.changed.Broadcast()
			f.mu.Unlock()
		}
	}
}

func (f *finals) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

// await waits until n final events were reported.
func (f *finals) await(t *testing.T, n int) {
	t.Helper()
	deadline := time.AfterFunc(5*time.Second, func() {
		f.mu.Lock()
		f.changed.Broadcast()
		f.mu.Unlock()
	})
	defer deadline.Stop()
	start := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	for f.n < n {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("%d final events reported, want %d", f.n, n)
		}
		f.changed.Wait()
	}
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
		io.WriteString(w, `{"receipt":"`+responseSecret+`"}`)
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

// Distinctive parts of the requests' keys and bodies and of the responses'
// bodies: no metric may carry them.
const (
	keySecret      = "cust8841rawkey"
	bodySecret     = "card4242secretbody"
	responseSecret = "receipt7f3asecret"
)

type req struct {
	path, key, body string
	block           bool
}

// client sends every request on a connection of its own: net/http's
// transport resends a request with an Idempotency-Key whose reused
// connection broke (as the panicking handler's does).
var client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// post sends r and returns the status, or 0 when no response came (the
// handler panicked).
func post(t *testing.T, base string, r req) int {
	t.Helper()
	hr, err := http.NewRequest(http.MethodPost, base+r.path, strings.NewReader(r.body))
	if err != nil {
		t.Fatal(err)
	}
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

// series returns the series of the metric family name in reg: for each,
// its labels as "name=value,..." in name order and its value (a
// histogram's sample count).
func series(t *testing.T, reg prometheus.Gatherer, name string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			sort.Strings(labels)
			var v float64
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				v = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				v = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				v = float64(m.GetHistogram().GetSampleCount())
			default:
				t.Fatalf("%s: unexpected type %v", name, mf.GetType())
			}
			out[strings.Join(labels, ",")] = v
		}
	}
	return out
}

// scrape fetches the metrics page at url as a Prometheus server does and
// returns its text and a Gatherer of the families parsed back from it.
func scrape(t *testing.T, url string) (string, prometheus.Gatherer) {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	text, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: status %d: %s", resp.StatusCode, text)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	parsed, err := parser.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		t.Fatalf("scrape: %v\n%s", err, text)
	}
	mfs := make([]*dto.MetricFamily, 0, len(parsed))
	for _, mf := range parsed {
		mfs = append(mfs, mf)
	}
	return string(text), prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) { return mfs, nil })
}

func outcome(route, outcome string) string {
	return fmt.Sprintf("method=POST,outcome=%s,route=POST %s", outcome, route)
}

func errKind(route, kind string) string {
	return fmt.Sprintf("error=%s,method=POST,route=POST %s", kind, route)
}

func running(route string) string { return "method=POST,route=POST " + route }

func expectSeries(t *testing.T, reg prometheus.Gatherer, name string, want map[string]float64) {
	t.Helper()
	if got := series(t, reg, name); !reflect.DeepEqual(got, want) {
		t.Errorf("%s:\n got  %v\n want %v", name, got, want)
	}
}

// TestEveryOutcome drives the real middleware over HTTP through every
// outcome, then scrapes the registry through promhttp as a Prometheus
// server would: each outcome counted once on its route, one latency
// observation per outcome, the errors, the running handlers back at 0, and
// no client key, storage key or body anywhere on the page.
func TestEveryOutcome(t *testing.T) {
	reg := prometheus.NewRegistry()
	f := newFinals()
	observe := f.wrap(idemprom.Observer(reg))

	clk := fakeclock.New(time.Unix(1_700_000_000, 0))
	store := memstore.New(memstore.WithClock(clk.Now))
	defer store.Close()
	mw := idempotency.New(store, idempotency.WithObserver(observe))
	down := idempotency.New(downStore{store}, idempotency.WithObserver(observe))
	open := idempotency.New(downStore{store}, idempotency.WithObserver(observe), idempotency.WithFailOpen(true))

	g := newGate()
	mux := http.NewServeMux()
	mux.Handle("POST /charges", mw(g.handler(http.StatusCreated)))
	mux.Handle("POST /slow", mw(g.handler(http.StatusCreated)))
	mux.Handle("POST /fail", mw(g.handler(http.StatusBadGateway)))
	mux.Handle("POST /panic", mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") })))
	mux.Handle("POST /down", down(g.handler(http.StatusCreated)))
	mux.Handle("POST /open", open(g.handler(http.StatusCreated)))
	mux.Handle("POST /steal", mw(g.handler(http.StatusCreated)))
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the panic's stack
	srv.Start()
	defer srv.Close()

	n := 0
	step := func(r req, want int) {
		t.Helper()
		if got := post(t, srv.URL, r); got != want {
			t.Fatalf("POST %s (key %q): status %d, want %d", r.path, r.key, got, want)
		}
		n++
		f.await(t, n)
	}
	step(req{path: "/charges", key: keySecret + "-1", body: bodySecret + "-a"}, http.StatusCreated)             // executed
	step(req{path: "/charges", key: keySecret + "-1", body: bodySecret + "-a"}, http.StatusCreated)             // replayed
	step(req{path: "/charges", key: keySecret + "-1", body: bodySecret + "-b"}, http.StatusUnprocessableEntity) // mismatch
	step(req{path: "/charges", key: strings.Repeat("k", 300)}, http.StatusBadRequest)                           // rejected
	step(req{path: "/fail", key: keySecret + "-2"}, http.StatusBadGateway)                                      // released
	step(req{path: "/panic", key: keySecret + "-3"}, 0)                                                         // released
	step(req{path: "/down", key: keySecret + "-4"}, http.StatusServiceUnavailable)                              // store_error
	step(req{path: "/open", key: keySecret + "-5"}, http.StatusCreated)                                         // failed_open

	// Conflict: a duplicate while the original runs.
	first := make(chan int, 1)
	go func() { first <- post(t, srv.URL, req{path: "/slow", key: keySecret + "-6", block: true}) }()
	g.awaitEntered(t)
	expectSeries(t, reg, "idempotency_handlers_running", map[string]float64{
		running("/charges"): 0, running("/fail"): 0, running("/panic"): 0, running("/slow"): 1,
	})
	step(req{path: "/slow", key: keySecret + "-6"}, http.StatusConflict) // conflict
	g.release <- struct{}{}
	if got := <-first; got != http.StatusCreated {
		t.Fatalf("original: status %d", got)
	}
	n++
	f.await(t, n) // executed

	// Steal: the owner's lease expires on the store's clock while its
	// handler still runs; a duplicate takes the record over and completes
	// it, and the owner's completion is refused.
	go func() {
		first <- post(t, srv.URL, req{path: "/steal", key: keySecret + "-7", body: bodySecret + "-s", block: true})
	}()
	g.awaitEntered(t)
	clk.Advance(11 * time.Second)                                                                 // past the default 10s lease
	step(req{path: "/steal", key: keySecret + "-7", body: bodySecret + "-s"}, http.StatusCreated) // stolen, executed
	if got := series(t, reg, "idempotency_handlers_running")[running("/steal")]; got != 1 {
		t.Errorf("running /steal with the old owner still running: %v, want 1", got)
	}
	g.release <- struct{}{}
	if got := <-first; got != http.StatusCreated { // the response is sent before the refusal
		t.Fatalf("old owner: status %d", got)
	}
	n++
	f.await(t, n) // lease_lost

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
	text, page := scrape(t, srv.URL+"/metrics")
	expectSeries(t, page, "idempotency_requests_total", outcomes)
	expectSeries(t, page, "idempotency_request_duration_seconds", durations)
	expectSeries(t, page, "idempotency_errors_total", map[string]float64{
		errKind("/down", "store_error"): 1,
		errKind("/open", "store_error"): 1,
		errKind("/steal", "lease_lost"): 1,
	})
	expectSeries(t, page, "idempotency_handlers_running", map[string]float64{
		running("/charges"): 0, running("/fail"): 0, running("/panic"): 0, running("/slow"): 0, running("/steal"): 0,
	})

	secrets := []string{keySecret, bodySecret, responseSecret, strings.Repeat("k", 64)}
	for i := 1; i <= 7; i++ {
		secrets = append(secrets, idempotency.StorageKey("", fmt.Sprintf("%s-%d", keySecret, i)))
	}
	for _, s := range secrets {
		if strings.Contains(text, s) {
			t.Errorf("the scrape carries %q:\n%s", s, text)
		}
	}
}

// TestRunningFollowsStarted checks that the gauge takes a handler off the
// series it added it to when the route named by the final event differs
// from the one Started named: a router beneath the middleware sets its
// pattern on the request while the handler runs.
func TestRunningFollowsStarted(t *testing.T) {
	reg := prometheus.NewRegistry()
	store := memstore.New()
	defer store.Close()
	g := newGate()
	routed := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Pattern = "POST /routed" // as chi does, beneath a middleware mounted with r.Use
		g.handler(http.StatusCreated).ServeHTTP(w, r)
	})
	h := idempotency.New(store, idempotency.WithObserver(idemprom.Observer(reg)))(routed)

	done := make(chan struct{})
	go func() {
		defer close(done)
		r := httptest.NewRequest(http.MethodPost, "/routed", nil)
		r.Header.Set(idempotency.HeaderKey, "k")
		r.Header.Set("X-Block", "1")
		h.ServeHTTP(httptest.NewRecorder(), r)
	}()
	g.awaitEntered(t)
	expectSeries(t, reg, "idempotency_handlers_running", map[string]float64{"method=POST,route=": 1})
	g.release <- struct{}{}
	<-done // ServeHTTP returns after the outcome was reported
	expectSeries(t, reg, "idempotency_handlers_running", map[string]float64{"method=POST,route=": 0})
	expectSeries(t, reg, "idempotency_requests_total", map[string]float64{"method=POST,outcome=executed,route=POST /routed": 1})
}

type traceKey struct{}

// TestExemplars checks that latency observations carry the labels of
// WithExemplar, in the registry and in an OpenMetrics scrape, and that
// labels Prometheus would refuse are dropped instead of panicking.
func TestExemplars(t *testing.T) {
	reg := prometheus.NewRegistry()
	observe := idemprom.Observer(reg, idemprom.WithExemplar(func(ctx context.Context) prometheus.Labels {
		id, _ := ctx.Value(traceKey{}).(string)
		if id == "" {
			return nil
		}
		return prometheus.Labels{"trace_id": id}
	}))
	store := memstore.New()
	defer store.Close()
	h := idempotency.New(store, idempotency.WithObserver(observe))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	send := func(key, traceID string) {
		r := httptest.NewRequest(http.MethodPost, "/x", nil)
		r.Header.Set(idempotency.HeaderKey, key)
		if traceID != "" {
			r = r.WithContext(context.WithValue(r.Context(), traceKey{}, traceID))
		}
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	send("a", traceID)
	send("b", strings.Repeat("x", 200)) // over 128 runes: no exemplar
	send("c", "")

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var exemplars []string
	var count uint64
	for _, mf := range mfs {
		if mf.GetName() != "idempotency_request_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			count += m.GetHistogram().GetSampleCount()
			for _, b := range m.GetHistogram().GetBucket() {
				if ex := b.GetExemplar(); ex != nil {
					for _, l := range ex.GetLabel() {
						exemplars = append(exemplars, l.GetName()+"="+l.GetValue())
					}
				}
			}
		}
	}
	if count != 3 {
		t.Errorf("observations: %d, want 3", count)
	}
	if want := []string{"trace_id=" + traceID}; !reflect.DeepEqual(exemplars, want) {
		t.Errorf("exemplars %v, want %v", exemplars, want)
	}

	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{EnableOpenMetrics: true}))
	defer srv.Close()
	sr, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	sr.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	resp, err := http.DefaultClient.Do(sr)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `# {trace_id="`+traceID+`"}`) {
		t.Errorf("the OpenMetrics scrape has no exemplar:\n%s", body)
	}
}

// TestConcurrent sends many requests at once, duplicates among them, and
// checks that every request is counted once and no handler stays counted
// as running.
func TestConcurrent(t *testing.T) {
	reg := prometheus.NewRegistry()
	f := newFinals()
	store := memstore.New()
	defer store.Close()
	h := idempotency.New(store, idempotency.WithObserver(f.wrap(idemprom.Observer(reg))))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(time.Millisecond)
		w.WriteHeader(http.StatusCreated)
	}))
	const workers, each = 8, 25
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				r := httptest.NewRequest(http.MethodPost, "/c", nil)
				r.Header.Set(idempotency.HeaderKey, fmt.Sprint((w*each+i)%40)) // 40 keys, 5 requests each
				h.ServeHTTP(httptest.NewRecorder(), r)
			}
		}()
	}
	wg.Wait()
	f.await(t, workers*each)

	var total float64
	for k, v := range series(t, reg, "idempotency_requests_total") {
		if !strings.Contains(k, "outcome=stolen") {
			total += v
		}
	}
	if total != workers*each {
		t.Errorf("requests counted: %v, want %d", total, workers*each)
	}
	got := series(t, reg, "idempotency_requests_total")["method=POST,outcome=executed,route="]
	if got != 40 {
		t.Errorf("executed: %v, want 40 (one per key)", got)
	}
	expectSeries(t, reg, "idempotency_handlers_running", map[string]float64{"method=POST,route=": 0})
}

// TestOptions checks the namespace, the constant labels and the buckets.
func TestOptions(t *testing.T) {
	reg := prometheus.NewRegistry()
	observe := idemprom.Observer(reg,
		idemprom.WithNamespace("shop"),
		idemprom.WithConstLabels(prometheus.Labels{"service": "payments"}),
		idemprom.WithBuckets(0.5, 1, 2))
	observe(context.Background(), idempotency.Event{Kind: idempotency.EventReplayed, Route: "POST /p", Method: "POST",
		Duration: 700 * time.Millisecond, Final: true})

	expectSeries(t, reg, "shop_idempotency_requests_total", map[string]float64{
		"method=POST,outcome=replayed,route=POST /p,service=payments": 1,
	})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
		if mf.GetName() != "shop_idempotency_request_duration_seconds" {
			continue
		}
		var bounds []float64
		var cumulative []uint64
		for _, b := range mf.GetMetric()[0].GetHistogram().GetBucket() {
			bounds = append(bounds, b.GetUpperBound())
			cumulative = append(cumulative, b.GetCumulativeCount())
		}
		if !reflect.DeepEqual(bounds, []float64{0.5, 1, 2}) || !reflect.DeepEqual(cumulative, []uint64{0, 1, 1}) {
			t.Errorf("buckets %v with counts %v, want [0.5 1 2] with [0 1 1]", bounds, cumulative)
		}
	}
	// A gauge with no series is not gathered.
	want := []string{"shop_idempotency_request_duration_seconds", "shop_idempotency_requests_total"}
	if !reflect.DeepEqual(names, want) {
		t.Errorf("families %v, want %v", names, want)
	}
}

// TestDefaultBuckets checks the default bounds are what the
// documentation says: increasing, from a millisecond to 30 seconds.
func TestDefaultBuckets(t *testing.T) {
	b := idemprom.DefaultBuckets
	if b[0] != 0.001 || b[len(b)-1] != 30 || !sort.Float64sAreSorted(b) {
		t.Errorf("DefaultBuckets = %v", b)
	}
}

// TestMisconfigurationPanics checks that every misconfiguration panics at
// construction.
func TestMisconfigurationPanics(t *testing.T) {
	twice := prometheus.NewRegistry()
	idemprom.Observer(twice)
	relayTwice := prometheus.NewRegistry()
	idemprom.RelayObserver(relayTwice)
	for name, f := range map[string]func(){
		"nil registerer":         func() { idemprom.Observer(nil) },
		"registered twice":       func() { idemprom.Observer(twice) },
		"bad namespace":          func() { idemprom.WithNamespace("my-service") },
		"const label route":      func() { idemprom.WithConstLabels(prometheus.Labels{"route": "x"}) },
		"const label outcome":    func() { idemprom.WithConstLabels(prometheus.Labels{"outcome": "x"}) },
		"reserved const label":   func() { idemprom.WithConstLabels(prometheus.Labels{"__name": "x"}) },
		"invalid const label":    func() { idemprom.WithConstLabels(prometheus.Labels{"a-b": "x"}) },
		"no buckets":             func() { idemprom.WithBuckets() },
		"unsorted buckets":       func() { idemprom.WithBuckets(1, 0.5) },
		"repeated bucket":        func() { idemprom.WithBuckets(1, 1) },
		"nil exemplar":           func() { idemprom.WithExemplar(nil) },
		"nil registerer, relay":  func() { idemprom.RelayObserver(nil) },
		"relay registered twice": func() { idemprom.RelayObserver(relayTwice) },
		"const label relay":      func() { idemprom.WithConstLabels(prometheus.Labels{"relay": "x"}) },
		"const label topic":      func() { idemprom.WithConstLabels(prometheus.Labels{"topic": "x"}) },
		"no age buckets":         func() { idemprom.WithAgeBuckets() },
		"unsorted age buckets":   func() { idemprom.WithAgeBuckets(60, 1) },
		"NaN age bucket":         func() { idemprom.WithAgeBuckets(1, math.NaN()) },
		"nil topic pattern":      func() { idemprom.WithTopicPattern(nil) },
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
