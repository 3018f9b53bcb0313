package idemotel

import (
	"context"
	"strings"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/go-idempotency/idempotency/outbox/relay"
)

// Attribute keys of the relay's metrics and of Sink's spans.
const (
	// RelayKey is the relay's name (relay.WithName).
	RelayKey = attribute.Key("idempotency.outbox.relay")
	// DestinationKey is the message's topic.
	DestinationKey = attribute.Key("messaging.destination.name")
	// DestinationTemplateKey is what WithTopicPattern made of the topic,
	// on Sink's spans when it is set.
	DestinationTemplateKey = attribute.Key("messaging.destination.template")
	// MessageIDKey is the message's ID (outbox.Envelope.ID), on Sink's
	// spans only.
	MessageIDKey = attribute.Key("messaging.message.id")
	// MessageBodySizeKey is the size of the message's payload in bytes.
	MessageBodySizeKey = attribute.Key("messaging.message.body.size")
	// OperationNameKey and OperationTypeKey say what Sink's span does:
	// publish, send.
	OperationNameKey = attribute.Key("messaging.operation.name")
	OperationTypeKey = attribute.Key("messaging.operation.type")
	// AttemptKey is the message's attempt (outbox.Envelope.Attempt): 1
	// for its first presentation.
	AttemptKey = attribute.Key("idempotency.outbox.attempt")
)

// DefaultAgeBuckets are the explicit bucket boundaries, in seconds, that
// idempotency.outbox.age advises unless WithAgeBuckets sets others: from 5
// milliseconds (a relay woken by the commit's notification, publishing to a
// broker nearby) to an hour (a message retried through a broker's outage
// with the relay's default backoff).
var DefaultAgeBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}

// RelayObserver creates the instruments of outbox relays with the meter
// provider (see WithMeterProvider; WithBuckets, WithAgeBuckets and
// WithTopicPattern apply too) and returns the function that records them,
// for relay.WithObserver (see the package documentation for the
// instruments). Pass the function to every relay that should report into
// these metrics; it is safe for concurrent use. RelayObserver panics when
// the provider refuses an instrument.
func RelayObserver(opts ...Option) func(ctx context.Context, e relay.Event) {
	cfg := newConfig(opts)
	meter := cfg.meterProvider.Meter(ScopeName)
	m := &relayMetrics{topic: cfg.topic}
	var err error
	// A synchronous gauge: the relay pushes its lag as it reads it, and
	// the SDK keeps the last value of each relay with its context, where
	// an observable one would need a copy kept here for its callback.
	m.lag, err = meter.Float64Gauge("idempotency.outbox.lag",
		metric.WithUnit("s"),
		metric.WithDescription("How long the earliest due outbox message has been waiting (0 when none is due), as the relay last read it."))
	must("RelayObserver", err)
	counter := func(name, unit, description string) metric.Int64Counter {
		c, err := meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(description))
		must("RelayObserver", err)
		return c
	}
	m.claimed = counter("idempotency.outbox.claimed", "{message}", "Outbox messages the relay claimed.")
	m.published = counter("idempotency.outbox.published", "{message}", "Outbox messages the sink confirmed and the relay marked done.")
	m.retried = counter("idempotency.outbox.retried", "{message}", "Outbox messages whose publish failed, waiting for a retry after a backoff.")
	m.dead = counter("idempotency.outbox.dead", "{message}", "Outbox messages dead after their last allowed attempt (a failed publish or a claim that ran out).")
	m.reclaimed = counter("idempotency.outbox.reclaimed", "{message}", "Outbox messages taken back from a claim that ran out before its relay marked an outcome, waiting for a retry.")
	m.fenced = counter("idempotency.outbox.fenced", "{message}", "Outbox messages whose mark changed nothing, the relay's claim having been lost meanwhile (taken back, or suspended by an operator).")
	m.purged = counter("idempotency.outbox.purged", "{message}", "Finished outbox messages deleted past the retention.")
	m.errors = counter("idempotency.outbox.errors", "{error}", "Failed relay statements (claims, marks, extends, purges); the relay carries on after a pause.")
	m.extended = counter("idempotency.outbox.extended", "{message}", "Outbox messages whose claim the relay extended while its sink worked on them or they waited for their turn or their done mark.")
	m.claimLost = counter("idempotency.outbox.claim_lost", "{message}", "Outbox messages whose claim the relay found lost before it marked an outcome (canceled, suspended, taken back, or not extended in time); their sink's context was cancelled.")
	m.released = counter("idempotency.outbox.released", "{message}", "Claimed outbox messages handed back unpresented (the relay stopped, or too little of the claim was left).")
	m.refused = counter("idempotency.outbox.refused", "{message}", "Outbox messages the sink refused permanently, dead at once.")
	m.unreadable = counter("idempotency.outbox.unreadable", "{message}", "Outbox rows the relay could not read, set apart dead while their batch went on.")
	m.suspended = counter("idempotency.outbox.suspended", "{message}", "Outbox messages the sink suspended until an operator resumes them.")
	m.canceled = counter("idempotency.outbox.canceled", "{message}", "Outbox messages canceled while the relay presented them, their marks refused.")
	m.duration, err = meter.Float64Histogram("idempotency.outbox.publish.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Time the sink took to confirm an outbox message that was then marked done."),
		metric.WithExplicitBucketBoundaries(cfg.buckets...))
	must("RelayObserver", err)
	m.age, err = meter.Float64Histogram("idempotency.outbox.age",
		metric.WithUnit("s"),
		metric.WithDescription("Time from an outbox message's enqueue to its confirmation by the sink."),
		metric.WithExplicitBucketBoundaries(cfg.ageBuckets...))
	must("RelayObserver", err)
	return m.observe
}

type relayMetrics struct {
	topic                                       func(string) string
	lag                                         metric.Float64Gauge
	claimed, purged, errors, extended, released metric.Int64Counter
	published, retried, dead, reclaimed, fenced metric.Int64Counter
	claimLost, refused, unreadable              metric.Int64Counter
	suspended, canceled                         metric.Int64Counter
	duration, age                               metric.Float64Histogram
}

func (m *relayMetrics) observe(ctx context.Context, e relay.Event) {
	name := RelayKey.String(validText(e.Relay))
	// Each event builds only the attribute set it records with.
	byRelay := func() metric.MeasurementOption {
		return metric.WithAttributeSet(attribute.NewSet(name))
	}
	byTopic := func() metric.MeasurementOption {
		return metric.WithAttributeSet(attribute.NewSet(name, DestinationKey.String(topicValue(m.topic, e.Topic))))
	}
	switch e.Kind {
	case relay.EventLag:
		m.lag.Record(ctx, max(e.Lag.Seconds(), 0), byRelay())
	case relay.EventClaimed:
		m.claimed.Add(ctx, int64(max(e.Count, 0)), byRelay())
	case relay.EventPurged:
		m.purged.Add(ctx, int64(max(e.Count, 0)), byRelay())
	case relay.EventError:
		m.errors.Add(ctx, 1, byRelay())
	case relay.EventPublished:
		set := byTopic()
		m.published.Add(ctx, 1, set)
		m.duration.Record(ctx, max(e.Duration.Seconds(), 0), set)
		// Age is the relay's clock against the server's: a skew can make
		// it negative.
		m.age.Record(ctx, max(e.Age.Seconds(), 0), set)
	case relay.EventRetried:
		m.retried.Add(ctx, 1, byTopic())
	case relay.EventDead:
		m.dead.Add(ctx, 1, byTopic())
	case relay.EventReclaimed:
		m.reclaimed.Add(ctx, 1, byTopic())
	case relay.EventFenced:
		m.fenced.Add(ctx, 1, byTopic())
	case relay.EventExtended:
		m.extended.Add(ctx, int64(max(e.Count, 0)), byRelay())
	case relay.EventReleased:
		m.released.Add(ctx, int64(max(e.Count, 0)), byRelay())
	case relay.EventClaimLost:
		m.claimLost.Add(ctx, 1, byTopic())
	case relay.EventRefused:
		m.refused.Add(ctx, 1, byTopic())
	case relay.EventUnreadable:
		m.unreadable.Add(ctx, 1, byTopic())
	case relay.EventSuspended:
		m.suspended.Add(ctx, 1, byTopic())
	case relay.EventCanceled:
		m.canceled.Add(ctx, 1, byTopic())
	}
}

// topicValue returns what pattern (WithTopicPattern) makes of topic, or
// topic when there is none, as valid UTF-8.
func topicValue(pattern func(string) string, topic string) string {
	if pattern != nil {
		topic = pattern(topic)
	}
	return validText(topic)
}

// validText returns s as valid UTF-8: an exporter's protocol buffers
// refuse other strings, and with them the batch they are in. A relay's name
// (relay.WithName) can be any string; topics are UTF-8 (outbox.Enqueue
// refuses others), but WithTopicPattern's are not checked.
func validText(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
