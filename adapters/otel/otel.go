// Package idemotel reports the idempotency middleware through
// OpenTelemetry: Observer turns its events into metrics, and Store wraps a
// store so that every store call is a span, a child of the request's span.
//
//	store := idemotel.Store(redisstore.New(client))
//	mw := idempotency.New(store, idempotency.WithObserver(idemotel.Observer()))
//
// Both use the global providers (otel.GetMeterProvider,
// otel.GetTracerProvider) unless WithMeterProvider or WithTracerProvider
// name others.
//
// # Metrics
//
//	idempotency.requests          counter        {request}  http.route, http.request.method, idempotency.outcome
//	idempotency.request.duration  histogram      s          http.route, http.request.method, idempotency.outcome
//	idempotency.handlers.running  up-down count  {handler}  http.route, http.request.method
//	idempotency.errors            counter        {error}    http.route, http.request.method, error.type
//
// idempotency.requests counts every request the middleware covers with a
// key (or rejects for want of one) once, under its outcome, the kind of its
// final event (see OutcomeValue): executed, replayed, conflict, mismatch,
// released, lease_lost, store_error, failed_open or rejected. A request
// that took the record over from an owner whose lease had expired counts
// once more, under stolen, when the steal happens.
//
// idempotency.request.duration records Event.Duration of each outcome (the
// time from the request entering the middleware to its outcome), with the
// same attributes as idempotency.requests (never stolen).
//
// idempotency.handlers.running adds one on EventStarted and takes one off
// on the request's final event with Ran set: the handlers running under a
// lease. A handler run unprotected by WithFailOpen is not counted.
//
// idempotency.errors counts every EventLeaseLost and EventStoreError,
// whether it is the request's outcome or reported in addition to it (a lease
// lost while the handler ran, a failed extend or release), with error.type
// lease_lost or store_error.
//
// Measurements are made with the request's context, so an SDK that keeps
// exemplars attaches the request's trace to them.
//
// # Spans
//
// The middleware calls the store with contexts derived from the request's
// (Acquire with the request's context; Complete, Release, Extend and the
// transaction's calls with its values, without its cancellation), so the
// spans of Store are children of the request's span, if it has one:
//
//	idempotency.acquire   Store.Acquire      idempotency.acquire.outcome, idempotency.epoch
//	idempotency.wait      Store.Watch, until the waiter stops watching; idempotency.notified
//	idempotency.complete  Store.Complete     idempotency.response.status, idempotency.response.body_size
//	idempotency.release   Store.Release
//	idempotency.extend    Store.Extend       (the heartbeat, while the handler runs)
//	idempotency.begin     TxStore.BeginTx    (routes with WithTransaction)
//	idempotency.commit    Tx.Complete        idempotency.response.status, idempotency.response.body_size
//	idempotency.rollback  Tx.Rollback
//
// A call that fails records its error, sets the span's status to Error and
// error.type (see ErrorType). With WithKeyHash(true) every span also carries
// idempotency.key_hash, the storage key.
//
// Neither metrics nor spans ever carry the client's key or a body: the store
// is only given the storage key, a hash of scope and key. http.route is what
// the middleware names the route (see idempotency.WithRoute): a pattern such
// as "POST /payments/{id}", never the path, or every id becomes a series of
// its own.
package idemotel

import (
	"fmt"
	"math"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the meter and the tracer.
const ScopeName = "github.com/go-idempotency/idempotency/adapters/otel"

// DefaultBuckets are the explicit bucket boundaries, in seconds, that
// idempotency.request.duration advises unless WithBuckets sets others (a
// View of the SDK can still replace them): from a millisecond (a replay
// from an in-process store) to 30 seconds (a slow handler, a duplicate
// waiting in wait mode).
var DefaultBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// Option configures Observer and Store; each option says which it affects.
type Option func(*config)

type config struct {
	meterProvider  metric.MeterProvider
	tracerProvider trace.TracerProvider
	buckets        []float64
	keyHash        bool
}

func newConfig(opts []Option) config {
	cfg := config{buckets: DefaultBuckets}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.meterProvider == nil {
		cfg.meterProvider = otel.GetMeterProvider()
	}
	if cfg.tracerProvider == nil {
		cfg.tracerProvider = otel.GetTracerProvider()
	}
	return cfg
}

// WithMeterProvider sets the meter provider of Observer's instruments.
// Default: otel.GetMeterProvider() when Observer is called.
func WithMeterProvider(mp metric.MeterProvider) Option {
	if mp == nil {
		panic("idemotel: WithMeterProvider needs a MeterProvider")
	}
	return func(c *config) { c.meterProvider = mp }
}

// WithTracerProvider sets the tracer provider of Store's spans.
// Default: otel.GetTracerProvider() when Store is called.
func WithTracerProvider(tp trace.TracerProvider) Option {
	if tp == nil {
		panic("idemotel: WithTracerProvider needs a TracerProvider")
	}
	return func(c *config) { c.tracerProvider = tp }
}

// WithBuckets sets the bucket boundaries, in seconds, that Observer's
// duration histogram advises. It panics when there are none, or they are
// not strictly increasing.
// Default: DefaultBuckets.
func WithBuckets(bounds ...float64) Option {
	if len(bounds) == 0 {
		panic("idemotel: WithBuckets needs at least one bound")
	}
	for i, b := range bounds {
		if math.IsNaN(b) || math.IsInf(b, 0) || i > 0 && b <= bounds[i-1] {
			panic(fmt.Sprintf("idemotel: WithBuckets needs strictly increasing finite bounds, got %v", bounds))
		}
	}
	own := append([]float64(nil), bounds...)
	return func(c *config) { c.buckets = own }
}

// WithKeyHash makes Store's spans carry the storage key (a hash of scope
// and key, never the client's key) as idempotency.key_hash, to find every
// call made for one record.
// Default: false.
func WithKeyHash(on bool) Option {
	return func(c *config) { c.keyHash = on }
}
