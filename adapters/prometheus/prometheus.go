// Package idemprom exports the events of the idempotency middleware as
// Prometheus metrics. Observer registers the metrics and returns the
// function to pass to idempotency.WithObserver:
//
//	observe := idemprom.Observer(prometheus.DefaultRegisterer)
//	mw := idempotency.New(store, idempotency.WithObserver(observe))
//
// The metrics (names without WithNamespace; every series also carries the
// labels of WithConstLabels):
//
//	idempotency_requests_total{route, method, outcome}            counter
//	idempotency_request_duration_seconds{route, method, outcome}  histogram
//	idempotency_handlers_running{route, method}                   gauge
//	idempotency_errors_total{route, method, error}                counter
//
// requests_total counts every request the middleware covers with a key (or
// rejects for want of one) once, under its outcome, the kind of its final
// event (see OutcomeLabel):
// executed, replayed, conflict, mismatch, released, lease_lost,
// store_error, failed_open or rejected. A request that took the record
// over from an owner whose lease had expired counts once more, under
// stolen, when the steal happens; the sum over all outcomes but stolen is
// the number of requests.
//
// request_duration_seconds observes Event.Duration of each outcome (the
// time from the request entering the middleware to its outcome), with the
// same labels as requests_total (never stolen).
//
// handlers_running is the number of handlers running under a lease: one is
// added on EventStarted and taken off on the request's final event (its
// outcome) with Ran set. A handler run unprotected by WithFailOpen is not
// counted.
//
// errors_total counts every EventLeaseLost and EventStoreError, whether
// it is the request's outcome or reported in addition to it (a lease lost
// while the handler ran, a failed extend, a failed release), under error
// lease_lost or store_error. A failed-open request counts here as a
// store_error.
//
// Labels never carry the client's key or any body. route is what the
// middleware names the route (see idempotency.WithRoute): a pattern such as
// "POST /payments/{id}", never the path, or every id becomes a series of
// its own.
//
// # Outbox relays
//
// RelayObserver registers the metrics of outbox relays and returns the
// function to pass to relay.WithObserver:
//
//	observe := idemprom.RelayObserver(prometheus.DefaultRegisterer)
//	r := relay.New(pool, sink, relay.WithName("payments-relay"), relay.WithObserver(observe))
//
// The metrics (names without WithNamespace, with the labels of
// WithConstLabels too):
//
//	idempotency_outbox_lag_seconds{relay}                     gauge
//	idempotency_outbox_claimed_total{relay}                   counter
//	idempotency_outbox_published_total{relay, topic}          counter
//	idempotency_outbox_retried_total{relay, topic}            counter
//	idempotency_outbox_dead_total{relay, topic}               counter
//	idempotency_outbox_reclaimed_total{relay, topic}          counter
//	idempotency_outbox_fenced_total{relay, topic}             counter
//	idempotency_outbox_purged_total{relay}                    counter
//	idempotency_outbox_extended_total{relay}                  counter
//	idempotency_outbox_released_total{relay}                  counter
//	idempotency_outbox_claim_lost_total{relay, topic}         counter
//	idempotency_outbox_refused_total{relay, topic}            counter
//	idempotency_outbox_unreadable_total{relay, topic}         counter
//	idempotency_outbox_suspended_total{relay, topic}          counter
//	idempotency_outbox_canceled_total{relay, topic}           counter
//	idempotency_outbox_errors_total{relay}                    counter
//	idempotency_outbox_publish_duration_seconds{relay, topic} histogram
//	idempotency_outbox_age_seconds{relay, topic}              histogram
//
// Each follows one relay.EventKind: lag_seconds is the last EventLag's
// Lag (how long the earliest due message has been waiting, 0 when none
// is); claimed_total and purged_total add the Count of EventClaimed and
// EventPurged; published_total, retried_total, dead_total,
// reclaimed_total and fenced_total count the events of those kinds, one
// per message (dead_total both the failed last attempts and the claims
// that ran out on one); errors_total counts EventError, the relay's failed
// statements. publish_duration_seconds observes the Duration of each
// EventPublished (the sink's confirm, buckets of WithBuckets), and
// age_seconds its Age (from the enqueue to the confirmation, buckets of
// WithAgeBuckets).
//
// relay is the relay's name (relay.WithName). Its default holds the
// process ID and random bytes, new at every start: give a relay a name
// that stays (the service's), or every restart begins new series. topic is
// the message's topic (see WithTopicPattern), fine as a label while topics
// are few, as they are when they name kinds of messages; when they carry
// IDs, map them to patterns. Neither ever carries a message's ID (which
// holds the record's storage key), its ordering key, headers or payload,
// nor an error's text.
package idemprom

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"

	"github.com/go-idempotency/idempotency"
)

// DefaultBuckets are the upper bounds, in seconds, of the latency
// histograms' buckets unless WithBuckets sets others: from a millisecond (a
// replay from an in-process store, a broker's confirm nearby) to 30 seconds
// (a slow handler, a duplicate waiting in wait mode, a publish running into
// the relay's claim lease).
var DefaultBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// Label values of the outcome label that are not an EventKind's name.
const (
	// OutcomeFailedOpen is the outcome of a request whose store could not
	// be reached and whose handler then ran unprotected (WithFailOpen): an
	// EventStoreError outcome with FailedOpen set.
	OutcomeFailedOpen = "failed_open"
	// OutcomeStolen counts steals, in addition to the outcome of the
	// request that stole.
	OutcomeStolen = "stolen"
)

// OutcomeLabel returns the outcome label of a final event: the name of
// its kind (idempotency.EventKind.String), except for an EventStoreError
// with FailedOpen set, which is OutcomeFailedOpen.
func OutcomeLabel(e idempotency.Event) string {
	if e.Kind == idempotency.EventStoreError && e.FailedOpen {
		return OutcomeFailedOpen
	}
	return e.Kind.String()
}

// Option configures Observer and RelayObserver; each option says which it
// affects.
type Option func(*config)

type config struct {
	namespace   string
	constLabels prometheus.Labels
	buckets     []float64
	ageBuckets  []float64
	exemplar    func(context.Context) prometheus.Labels
	topic       func(string) string
}

// The labels the metrics set themselves; WithConstLabels may not use them.
var ownLabels = []string{"route", "method", "outcome", "error", "relay", "topic"}

// WithNamespace puts namespace and an underscore in front of every metric
// name ("payments" gives payments_idempotency_requests_total); "" puts
// nothing, for Observer's and RelayObserver's. It panics when namespace is
// not a valid metric name.
// Default: none (idempotency_requests_total).
func WithNamespace(namespace string) Option {
	if namespace != "" && !validName(namespace) {
		panic(fmt.Sprintf("idemprom: WithNamespace: %q is not a valid metric name prefix", namespace))
	}
	return func(c *config) { c.namespace = namespace }
}

// WithConstLabels adds labels with fixed values to every series of
// Observer and RelayObserver (a service or store name, say). It panics on
// a name that is invalid, starts with "__", or is one the metrics set
// themselves (route, method, outcome, error, relay, topic).
// Default: none.
func WithConstLabels(labels prometheus.Labels) Option {
	own := make(prometheus.Labels, len(labels))
	for name, value := range labels {
		if !validName(name) || strings.HasPrefix(name, "__") {
			panic(fmt.Sprintf("idemprom: WithConstLabels: %q is not a valid label name", name))
		}
		for _, l := range ownLabels {
			if name == l {
				panic(fmt.Sprintf("idemprom: WithConstLabels: the metrics set the label %q themselves", name))
			}
		}
		own[name] = value
	}
	return func(c *config) { c.constLabels = own }
}

// WithBuckets sets the upper bounds, in seconds, of the latency histograms'
// buckets: Observer's request duration and RelayObserver's publish
// duration. It panics when there are none, or they are not strictly
// increasing.
// Default: DefaultBuckets.
func WithBuckets(bounds ...float64) Option {
	own := checkBuckets("WithBuckets", bounds)
	return func(c *config) { c.buckets = own }
}

// WithExemplar attaches an exemplar to each of Observer's latency
// observations: the labels exemplar returns for the request's context, typically the trace
// id of the request's sampled span. It is called on the request's
// goroutine for every outcome; when it returns no labels, or labels
// Prometheus would refuse (more than 128 runes in all, an invalid name),
// the observation has no exemplar. Exemplars are exposed in the
// OpenMetrics format only (promhttp.HandlerOpts.EnableOpenMetrics).
//
// With OpenTelemetry tracing:
//
//	idemprom.WithExemplar(func(ctx context.Context) prometheus.Labels {
//		if sc := trace.SpanContextFromContext(ctx); sc.IsSampled() {
//			return prometheus.Labels{"trace_id": sc.TraceID().String()}
//		}
//		return nil
//	})
//
// Default: none (this package does not depend on a tracing library).
func WithExemplar(exemplar func(ctx context.Context) prometheus.Labels) Option {
	if exemplar == nil {
		panic("idemprom: WithExemplar needs a function")
	}
	return func(c *config) { c.exemplar = exemplar }
}

// Observer registers the metrics with reg and returns the function that
// updates them, for idempotency.WithObserver. Call it once per registry and
// pass the function to every middleware (every New) that should report
// into these metrics; it is safe for concurrent use.
//
// reg is required, as promauto.With and promhttp.InstrumentMetricHandler
// take theirs: there is no default registry. Pass
// prometheus.DefaultRegisterer for the global one (served by
// promhttp.Handler), or a registry of your own.
//
// Observer panics when reg is nil or refuses the metrics (the same
// metrics registered twice, or colliding with others).
func Observer(reg prometheus.Registerer, opts ...Option) func(ctx context.Context, e idempotency.Event) {
	if reg == nil {
		panic("idemprom: Observer needs a Registerer (prometheus.DefaultRegisterer for the global one)")
	}
	cfg := newConfig(opts)
	m := &metrics{
		exemplar: cfg.exemplar,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: cfg.namespace, Subsystem: subsystem, Name: "requests_total",
			Help:        "Requests with an Idempotency-Key, once each by outcome; a request that stole an expired lease counts once more as stolen.",
			ConstLabels: cfg.constLabels,
		}, []string{"route", "method", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: cfg.namespace, Subsystem: subsystem, Name: "request_duration_seconds",
			Help:        "Time from a request entering the idempotency middleware to its outcome.",
			ConstLabels: cfg.constLabels,
			Buckets:     cfg.buckets,
		}, []string{"route", "method", "outcome"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: cfg.namespace, Subsystem: subsystem, Name: "errors_total",
			Help:        "Lease losses and store errors, as outcomes or in addition to one (a lease lost while the handler ran, a failed extend or release).",
			ConstLabels: cfg.constLabels,
		}, []string{"route", "method", "error"}),
	}
	m.running = running{
		gauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: cfg.namespace, Subsystem: subsystem, Name: "handlers_running",
			Help:        "Handlers running under an idempotency lease.",
			ConstLabels: cfg.constLabels,
		}, []string{"route", "method"}),
		byKey: map[string][]prometheus.Gauge{},
	}
	register(reg, "Observer", m.requests, m.duration, m.running.gauge, m.errors)
	return m.observe
}

// subsystem is the middle part of every metric's name.
const subsystem = "idempotency"

// newConfig applies opts over the defaults.
func newConfig(opts []Option) config {
	cfg := config{buckets: DefaultBuckets, ageBuckets: DefaultAgeBuckets}
	for _, o := range opts {
		o(&cfg)
	}
	return cfg
}

// register registers cs with reg, panicking, in the name of the function
// fn, when reg refuses one.
func register(reg prometheus.Registerer, fn string, cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			panic(fmt.Sprintf("idemprom: %s: %v", fn, err))
		}
	}
}

type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	errors   *prometheus.CounterVec
	running  running
	exemplar func(context.Context) prometheus.Labels
}

func (m *metrics) observe(ctx context.Context, e idempotency.Event) {
	switch {
	case e.Final:
		outcome := OutcomeLabel(e)
		m.requests.WithLabelValues(e.Route, e.Method, outcome).Inc()
		m.observeDuration(ctx, m.duration.WithLabelValues(e.Route, e.Method, outcome), e.Duration.Seconds())
		if e.Ran {
			m.running.finish(e.Key)
		}
	case e.Kind == idempotency.EventStarted:
		m.running.start(e.Key, e.Route, e.Method)
	case e.Kind == idempotency.EventStolen:
		m.requests.WithLabelValues(e.Route, e.Method, OutcomeStolen).Inc()
	}
	if e.Kind == idempotency.EventLeaseLost || e.Kind == idempotency.EventStoreError {
		m.errors.WithLabelValues(e.Route, e.Method, e.Kind.String()).Inc()
	}
}

func (m *metrics) observeDuration(ctx context.Context, o prometheus.Observer, seconds float64) {
	if m.exemplar != nil {
		if labels := m.exemplar(ctx); len(labels) > 0 && validExemplar(labels) {
			if eo, ok := o.(prometheus.ExemplarObserver); ok {
				eo.ObserveWithExemplar(seconds, labels)
				return
			}
		}
	}
	o.Observe(seconds)
}

// running keeps the gauge of running handlers. A final event can name
// another route than the Started before it did (a router beneath the middleware sets
// its pattern on the request while the handler runs), so the gauge a
// Started added to is remembered by storage key, and the final event takes
// one off that one. Two handlers run on one key at once only after a steal;
// they are of one route.
type running struct {
	gauge *prometheus.GaugeVec
	mu    sync.Mutex
	byKey map[string][]prometheus.Gauge // storage key: the gauges its running handlers added to
}

func (r *running) start(key, route, method string) {
	g := r.gauge.WithLabelValues(route, method)
	g.Inc()
	r.mu.Lock()
	r.byKey[key] = append(r.byKey[key], g)
	r.mu.Unlock()
}

func (r *running) finish(key string) {
	r.mu.Lock()
	gs := r.byKey[key]
	if len(gs) == 0 { // no Started seen: nothing to take off
		r.mu.Unlock()
		return
	}
	g := gs[0]
	if len(gs) == 1 {
		delete(r.byKey, key)
	} else {
		r.byKey[key] = gs[1:]
	}
	r.mu.Unlock()
	g.Dec()
}

// validName reports whether s is a valid metric or label name in the
// classic character set.
func validName(s string) bool {
	return s != "" && model.LegacyValidation.IsValidMetricName(s) && !strings.Contains(s, ":")
}

// validExemplar reports whether Prometheus accepts labels as an exemplar's
// (ObserveWithExemplar panics otherwise).
func validExemplar(labels prometheus.Labels) bool {
	runes := 0
	for name, value := range labels {
		if !model.UTF8Validation.IsValidLabelName(name) || strings.HasPrefix(name, "__") || !utf8.ValidString(value) {
			return false
		}
		runes += utf8.RuneCountInString(name) + utf8.RuneCountInString(value)
	}
	return runes <= prometheus.ExemplarMaxRunes
}
