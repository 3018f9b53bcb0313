package idemotel

import (
	"context"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/go-idempotency/idempotency"
)

// Attribute keys of the metrics.
const (
	RouteKey   = attribute.Key("http.route")
	MethodKey  = attribute.Key("http.request.method")
	OutcomeKey = attribute.Key("idempotency.outcome")
	// ErrorTypeKey is the attribute of idempotency.errors and of failed
	// spans.
	ErrorTypeKey = attribute.Key("error.type")
)

// Values of idempotency.outcome that are not an EventKind's name.
const (
	// OutcomeFailedOpen is the outcome of a request whose store could not
	// be reached and whose handler then ran unprotected (WithFailOpen): an
	// EventStoreError outcome with FailedOpen set.
	OutcomeFailedOpen = "failed_open"
	// OutcomeStolen counts steals, in addition to the outcome of the
	// request that stole.
	OutcomeStolen = "stolen"
)

// OutcomeValue returns the idempotency.outcome of a final event: the name
// of its kind (idempotency.EventKind.String), except for an
// EventStoreError with FailedOpen set, which is OutcomeFailedOpen.
func OutcomeValue(e idempotency.Event) string {
	if e.Kind == idempotency.EventStoreError && e.FailedOpen {
		return OutcomeFailedOpen
	}
	return e.Kind.String()
}

// Observer creates the metrics' instruments with the meter provider (see
// WithMeterProvider; WithBuckets applies too) and returns the function that
// records them, for idempotency.WithObserver. Pass the function to every
// middleware (every New) that should report into these metrics; it is safe
// for concurrent use. Observer panics when the provider refuses an
// instrument.
func Observer(opts ...Option) func(ctx context.Context, e idempotency.Event) {
	cfg := newConfig(opts)
	meter := cfg.meterProvider.Meter(ScopeName)
	m := &metrics{byKey: map[string][]attribute.Set{}}
	var err error
	m.requests, err = meter.Int64Counter("idempotency.requests",
		metric.WithUnit("{request}"),
		metric.WithDescription("Requests with an Idempotency-Key, once each by outcome; a request that stole an expired lease counts once more as stolen."))
	must("Observer", err)
	m.duration, err = meter.Float64Histogram("idempotency.request.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Time from a request entering the idempotency middleware to its outcome."),
		metric.WithExplicitBucketBoundaries(cfg.buckets...))
	must("Observer", err)
	m.running, err = meter.Int64UpDownCounter("idempotency.handlers.running",
		metric.WithUnit("{handler}"),
		metric.WithDescription("Handlers running under an idempotency lease."))
	must("Observer", err)
	m.errors, err = meter.Int64Counter("idempotency.errors",
		metric.WithUnit("{error}"),
		metric.WithDescription("Lease losses and store errors, as outcomes or in addition to one (a lease lost while the handler ran, a failed extend or release)."))
	must("Observer", err)
	return m.observe
}

// must panics, naming the function that makes instruments, on err.
func must(function string, err error) {
	if err != nil {
		panic(fmt.Sprintf("idemotel: %s: %v", function, err))
	}
}

type metrics struct {
	requests metric.Int64Counter
	duration metric.Float64Histogram
	running  metric.Int64UpDownCounter
	errors   metric.Int64Counter

	// A final event can name another route than the Started before it did
	// (a router beneath the middleware sets its pattern on the request
	// while the handler runs), so the attributes a Started added one with
	// are remembered by storage key, and the final event takes one off with
	// those. Two handlers run on one key at once only after a steal; they
	// are of one route.
	mu    sync.Mutex
	byKey map[string][]attribute.Set
}

func (m *metrics) observe(ctx context.Context, e idempotency.Event) {
	switch {
	case e.Final:
		set := metric.WithAttributeSet(attribute.NewSet(RouteKey.String(e.Route), MethodKey.String(e.Method), OutcomeKey.String(OutcomeValue(e))))
		m.requests.Add(ctx, 1, set)
		m.duration.Record(ctx, e.Duration.Seconds(), set)
		if e.Ran {
			m.finish(ctx, e.Key)
		}
	case e.Kind == idempotency.EventStarted:
		m.start(ctx, e)
	case e.Kind == idempotency.EventStolen:
		m.requests.Add(ctx, 1, metric.WithAttributes(RouteKey.String(e.Route), MethodKey.String(e.Method), OutcomeKey.String(OutcomeStolen)))
	}
	if e.Kind == idempotency.EventLeaseLost || e.Kind == idempotency.EventStoreError {
		m.errors.Add(ctx, 1, metric.WithAttributes(RouteKey.String(e.Route), MethodKey.String(e.Method), ErrorTypeKey.String(e.Kind.String())))
	}
}

func (m *metrics) start(ctx context.Context, e idempotency.Event) {
	set := attribute.NewSet(RouteKey.String(e.Route), MethodKey.String(e.Method))
	m.running.Add(ctx, 1, metric.WithAttributeSet(set))
	m.mu.Lock()
	m.byKey[e.Key] = append(m.byKey[e.Key], set)
	m.mu.Unlock()
}

func (m *metrics) finish(ctx context.Context, key string) {
	m.mu.Lock()
	sets := m.byKey[key]
	if len(sets) == 0 { // no Started seen: nothing to take off
		m.mu.Unlock()
		return
	}
	set := sets[0]
	if len(sets) == 1 {
		delete(m.byKey, key)
	} else {
		m.byKey[key] = sets[1:]
	}
	m.mu.Unlock()
	m.running.Add(ctx, -1, metric.WithAttributeSet(set))
}
