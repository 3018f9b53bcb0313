// Package idemotel reports the idempotency middleware through
// OpenTelemetry: Observer turns its events into metrics, and Store wraps a
// store so that every store call is a span, a child of the request's span.
//
//	store := idemotel.Store(redisstore.New(client))
//	mw := idempotency.New(store, idempotency.WithObserver(idemotel.Observer()))
//
// For the transactional outbox, RelayObserver turns a relay's events into
// metrics, TraceHeaders puts the request's trace context into the headers
// of the messages a handler enqueues, and Sink wraps a relay's sink so that
// every publish is a span in that trace:
//
//	outbox.Enqueue(ctx, outbox.Message{Topic: "payments.captured", Payload: body, Headers: idemotel.TraceHeaders(ctx)})
//	r := relay.New(pool, idemotel.Sink(sink), relay.WithObserver(idemotel.RelayObserver()))
//
// All use the global providers (otel.GetMeterProvider,
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
// is only given the storage key, a hash of scope and key (which Sink's spans
// carry within the message's ID). http.route is what the middleware names
// the route (see idempotency.WithRoute): a pattern such as
// "POST /payments/{id}", never the path, or every id becomes a series of
// its own.
//
// # Outbox relay metrics
//
//	idempotency.outbox.lag               gauge      s          idempotency.outbox.relay
//	idempotency.outbox.claimed           counter    {message}  idempotency.outbox.relay
//	idempotency.outbox.published         counter    {message}  idempotency.outbox.relay, messaging.destination.name
//	idempotency.outbox.retried           counter    {message}  idempotency.outbox.relay, messaging.destination.name
//	idempotency.outbox.dead              counter    {message}  idempotency.outbox.relay, messaging.destination.name
//	idempotency.outbox.reclaimed         counter    {message}  idempotency.outbox.relay, messaging.destination.name
//	idempotency.outbox.fenced            counter    {message}  idempotency.outbox.relay, messaging.destination.name
//	idempotency.outbox.purged            counter    {message}  idempotency.outbox.relay
//	idempotency.outbox.extended          counter    {message}  idempotency.outbox.relay
//	idempotency.outbox.released          counter    {message}  idempotency.outbox.relay
//	idempotency.outbox.claim_lost        counter    {message}  idempotency.outbox.relay, messaging.destination.name
//	idempotency.outbox.refused           counter    {message}  idempotency.outbox.relay, messaging.destination.name
//	idempotency.outbox.unreadable        counter    {message}  idempotency.outbox.relay, messaging.destination.name
//	idempotency.outbox.suspended         counter    {message}  idempotency.outbox.relay, messaging.destination.name
//	idempotency.outbox.canceled          counter    {message}  idempotency.outbox.relay, messaging.destination.name
//	idempotency.outbox.errors            counter    {error}    idempotency.outbox.relay
//	idempotency.outbox.publish.duration  histogram  s          idempotency.outbox.relay, messaging.destination.name
//	idempotency.outbox.age               histogram  s          idempotency.outbox.relay, messaging.destination.name
//
// Each follows one relay.EventKind: idempotency.outbox.lag records the Lag
// of each EventLag (how long the earliest due message has been waiting, 0
// when none is), with a synchronous gauge, as the relay pushes it;
// claimed and purged add the Count of EventClaimed and EventPurged;
// published, retried, dead, reclaimed and fenced count the events of those
// kinds, one per message (dead both the failed last attempts and the claims
// that ran out on one); errors counts EventError, the relay's failed
// statements. idempotency.outbox.publish.duration records the Duration of
// each EventPublished (the sink's confirm; WithBuckets), and
// idempotency.outbox.age its Age (from the enqueue to the confirmation;
// WithAgeBuckets).
//
// idempotency.outbox.relay is the relay's name (relay.WithName). Its
// default holds the process ID and random bytes, new at every start: give
// a relay a name that stays, or every restart begins new series.
// messaging.destination.name is the message's topic (see
// WithTopicPattern), fine as an attribute while topics are few, as they are
// when they name kinds of messages; when they carry IDs, map them to
// patterns. The metrics never carry a message's ID, ordering key, headers
// or payload, nor an error's text.
//
// # Outbox spans
//
// TraceHeaders returns the W3C trace context (traceparent, tracestate) of
// ctx's span, or what the propagator of WithPropagator injects, for a
// handler to add to outbox.Message.Headers. Sink extracts it from
// Envelope.Headers at publish, starts a producer span "publish <topic>" as
// its child, and hands the wrapped sink the headers with the producer
// span's trace context instead, so that a consumer continues the trace
// from the publish: request, publish and consumer in one trace.
package idemotel

import (
	"fmt"
	"math"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the meter and the tracer.
const ScopeName = "github.com/go-idempotency/idempotency/adapters/otel"

// DefaultBuckets are the explicit bucket boundaries, in seconds, that
// idempotency.request.duration and idempotency.outbox.publish.duration
// advise unless WithBuckets sets others (a View of the SDK can still
// replace them): from a millisecond (a replay from an in-process store, a
// broker's confirm nearby) to 30 seconds (a slow handler, a duplicate
// waiting in wait mode, a publish running into the relay's claim lease).
var DefaultBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// Option configures Observer, Store, RelayObserver, TraceHeaders and Sink;
// each option says which it affects.
type Option func(*config)

type config struct {
	meterProvider  metric.MeterProvider
	tracerProvider trace.TracerProvider
	propagator     propagation.TextMapPropagator
	buckets        []float64
	ageBuckets     []float64
	keyHash        bool
	topic          func(string) string
}

func newConfig(opts []Option) config {
	cfg := config{buckets: DefaultBuckets, ageBuckets: DefaultAgeBuckets, propagator: propagation.TraceContext{}}
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

// WithMeterProvider sets the meter provider of Observer's and
// RelayObserver's instruments.
// Default: otel.GetMeterProvider() when Observer or RelayObserver is
// called.
func WithMeterProvider(mp metric.MeterProvider) Option {
	if mp == nil {
		panic("idemotel: WithMeterProvider needs a MeterProvider")
	}
	return func(c *config) { c.meterProvider = mp }
}

// WithTracerProvider sets the tracer provider of Store's and Sink's spans.
// Default: otel.GetTracerProvider() when Store or Sink is called.
func WithTracerProvider(tp trace.TracerProvider) Option {
	if tp == nil {
		panic("idemotel: WithTracerProvider needs a TracerProvider")
	}
	return func(c *config) { c.tracerProvider = tp }
}

// WithBuckets sets the bucket boundaries, in seconds, that the duration
// histograms advise: Observer's idempotency.request.duration and
// RelayObserver's idempotency.outbox.publish.duration. It panics when
// there are none, or they are not strictly increasing.
// Default: DefaultBuckets.
func WithBuckets(bounds ...float64) Option {
	own := checkBuckets("WithBuckets", bounds)
	return func(c *config) { c.buckets = own }
}

// WithAgeBuckets sets the bucket boundaries, in seconds, that
// RelayObserver's idempotency.outbox.age advises (from a message's enqueue
// to its confirmation). It panics when there are none, or they are not
// strictly increasing.
// Default: DefaultAgeBuckets.
func WithAgeBuckets(bounds ...float64) Option {
	own := checkBuckets("WithAgeBuckets", bounds)
	return func(c *config) { c.ageBuckets = own }
}

// checkBuckets returns a copy of bounds, or panics, naming option, when
// there are none or they are not strictly increasing and finite.
func checkBuckets(option string, bounds []float64) []float64 {
	if len(bounds) == 0 {
		panic(fmt.Sprintf("idemotel: %s needs at least one bound", option))
	}
	for i, b := range bounds {
		if math.IsNaN(b) || math.IsInf(b, 0) || i > 0 && b <= bounds[i-1] {
			panic(fmt.Sprintf("idemotel: %s needs strictly increasing finite bounds, got %v", option, bounds))
		}
	}
	return append([]float64(nil), bounds...)
}

// WithPropagator sets the propagator that TraceHeaders injects the trace
// context into message headers with, and that Sink extracts it from the
// envelope's headers and injects the producer span's with. Pass
// otel.GetTextMapPropagator() to use the global one, or a composite with
// propagation.Baggage to carry baggage too (into every message, and to
// every consumer). It panics when p is nil.
// Default: propagation.TraceContext{}, the W3C traceparent and tracestate
// (not the global propagator, which propagates nothing until one is set).
func WithPropagator(p propagation.TextMapPropagator) Option {
	if p == nil {
		panic("idemotel: WithPropagator needs a TextMapPropagator")
	}
	return func(c *config) { c.propagator = p }
}

// WithTopicPattern sets the function that turns a message's topic into
// the value of RelayObserver's messaging.destination.name and of the name
// of Sink's spans ("publish <pattern>", the topic itself staying their
// messaging.destination.name, with the pattern as
// messaging.destination.template). Use it when topics carry IDs (a NATS
// subject such as "orders.8841.created"): return a pattern
// ("orders.*.created"), never the ID, or every ID becomes a series of its
// own. It is called from the relay's goroutines, for every event and
// publish of a message. It panics when fn is nil.
// Default: the topic as it is.
func WithTopicPattern(fn func(topic string) string) Option {
	if fn == nil {
		panic("idemotel: WithTopicPattern needs a function")
	}
	return func(c *config) { c.topic = fn }
}

// WithKeyHash makes Store's spans carry the storage key (a hash of scope
// and key, never the client's key) as idempotency.key_hash, to find every
// call made for one record.
// Default: false.
func WithKeyHash(on bool) Option {
	return func(c *config) { c.keyHash = on }
}
