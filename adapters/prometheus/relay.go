package idemprom

import (
	"context"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/go-idempotency/idempotency/outbox/relay"
)

// DefaultAgeBuckets are the upper bounds, in seconds, of the buckets of
// idempotency_outbox_age_seconds unless WithAgeBuckets sets others: from
// 5 milliseconds (a relay woken by the commit's notification, publishing to
// a broker nearby) to an hour (a message retried through a broker's outage
// with the relay's default backoff).
var DefaultAgeBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}

// WithAgeBuckets sets the upper bounds, in seconds, of the buckets of
// RelayObserver's age histogram (from a message's enqueue to its
// confirmation). It panics when there are none, or they are not strictly
// increasing.
// Default: DefaultAgeBuckets.
func WithAgeBuckets(bounds ...float64) Option {
	own := checkBuckets("WithAgeBuckets", bounds)
	return func(c *config) { c.ageBuckets = own }
}

// WithTopicPattern sets the function that turns a message's topic into
// the value of RelayObserver's topic label. Use it when topics carry IDs
// (a NATS subject such as "orders.8841.created"): return a pattern
// ("orders.*.created"), never the ID, or every ID becomes series of its
// own. It is called from the relay's goroutines, for every event of a
// message. It panics when fn is nil.
// Default: the topic as it is.
func WithTopicPattern(fn func(topic string) string) Option {
	if fn == nil {
		panic("idemprom: WithTopicPattern needs a function")
	}
	return func(c *config) { c.topic = fn }
}

// RelayObserver registers the metrics of outbox relays with reg and
// returns the function that updates them, for relay.WithObserver (see the
// package documentation for the metrics). Call it once per registry and
// pass the function to every relay that should report into these metrics;
// it is safe for concurrent use. WithNamespace, WithConstLabels,
// WithBuckets (the publish duration's), WithAgeBuckets and
// WithTopicPattern apply; WithExemplar does not (the relay reports with
// its own context, not a request's).
//
// reg is required, as for Observer. RelayObserver panics when reg is nil
// or refuses the metrics (the same metrics registered twice, or colliding
// with others). It registers other metrics than Observer: one registry
// takes both.
func RelayObserver(reg prometheus.Registerer, opts ...Option) func(ctx context.Context, e relay.Event) {
	if reg == nil {
		panic("idemprom: RelayObserver needs a Registerer (prometheus.DefaultRegisterer for the global one)")
	}
	cfg := newConfig(opts)
	byRelay := []string{"relay"}
	byTopic := []string{"relay", "topic"}
	counter := func(name, help string, labels []string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: cfg.namespace, Subsystem: subsystem, Name: name,
			Help: help, ConstLabels: cfg.constLabels,
		}, labels)
	}
	m := &relayMetrics{
		topic: cfg.topic,
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: cfg.namespace, Subsystem: subsystem, Name: "outbox_lag_seconds",
			Help:        "How long the earliest due outbox message has been waiting (0 when none is due), as the relay last read it.",
			ConstLabels: cfg.constLabels,
		}, byRelay),
		claimed:    counter("outbox_claimed_total", "Outbox messages the relay claimed.", byRelay),
		published:  counter("outbox_published_total", "Outbox messages the sink confirmed and the relay marked done.", byTopic),
		retried:    counter("outbox_retried_total", "Outbox messages whose publish failed, waiting for a retry after a backoff.", byTopic),
		dead:       counter("outbox_dead_total", "Outbox messages dead after their last allowed attempt (a failed publish or a claim that ran out).", byTopic),
		reclaimed:  counter("outbox_reclaimed_total", "Outbox messages taken back from a claim that ran out before its relay marked an outcome, waiting for a retry.", byTopic),
		fenced:     counter("outbox_fenced_total", "Outbox messages whose mark changed nothing, the relay's claim having been lost meanwhile (taken back, or suspended by an operator).", byTopic),
		purged:     counter("outbox_purged_total", "Finished outbox messages deleted past the retention.", byRelay),
		errors:     counter("outbox_errors_total", "Failed relay statements (claims, marks, extends, purges); the relay carries on after a pause.", byRelay),
		extended:   counter("outbox_extended_total", "Outbox messages whose claim the relay extended while its sink worked on them or they waited for their turn or their done mark.", byRelay),
		claimLost:  counter("outbox_claim_lost_total", "Outbox messages whose claim the relay found lost before it marked an outcome (canceled, suspended, taken back, or not extended in time); their sink's context was cancelled.", byTopic),
		released:   counter("outbox_released_total", "Claimed outbox messages handed back unpresented (the relay stopped, or too little of the claim was left).", byRelay),
		refused:    counter("outbox_refused_total", "Outbox messages the sink refused permanently, dead at once.", byTopic),
		unreadable: counter("outbox_unreadable_total", "Outbox rows the relay could not read, set apart dead while their batch went on.", byTopic),
		suspended:  counter("outbox_suspended_total", "Outbox messages the sink suspended until an operator resumes them.", byTopic),
		canceled:   counter("outbox_canceled_total", "Outbox messages canceled while the relay presented them, their marks refused.", byTopic),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: cfg.namespace, Subsystem: subsystem, Name: "outbox_publish_duration_seconds",
			Help:        "Time the sink took to confirm an outbox message that was then marked done.",
			ConstLabels: cfg.constLabels,
			Buckets:     cfg.buckets,
		}, byTopic),
		age: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: cfg.namespace, Subsystem: subsystem, Name: "outbox_age_seconds",
			Help:        "Time from an outbox message's enqueue to its confirmation by the sink.",
			ConstLabels: cfg.constLabels,
			Buckets:     cfg.ageBuckets,
		}, byTopic),
	}
	register(reg, "RelayObserver", m.lag, m.claimed, m.published, m.retried, m.dead, m.reclaimed, m.fenced, m.purged, m.errors,
		m.extended, m.claimLost, m.released, m.refused, m.unreadable, m.suspended, m.canceled, m.duration, m.age)
	return m.observe
}

type relayMetrics struct {
	topic                                       func(string) string
	lag                                         *prometheus.GaugeVec
	claimed, purged, errors, extended, released *prometheus.CounterVec
	published, retried, dead, reclaimed, fenced *prometheus.CounterVec
	claimLost, refused, unreadable              *prometheus.CounterVec
	suspended, canceled                         *prometheus.CounterVec
	duration, age                               *prometheus.HistogramVec
}

func (m *relayMetrics) observe(_ context.Context, e relay.Event) {
	name := labelValue(e.Relay)
	switch e.Kind {
	case relay.EventLag:
		m.lag.WithLabelValues(name).Set(max(e.Lag.Seconds(), 0))
	case relay.EventClaimed:
		m.claimed.WithLabelValues(name).Add(float64(max(e.Count, 0)))
	case relay.EventPurged:
		m.purged.WithLabelValues(name).Add(float64(max(e.Count, 0)))
	case relay.EventError:
		m.errors.WithLabelValues(name).Inc()
	case relay.EventPublished:
		topic := m.topicLabel(e.Topic)
		m.published.WithLabelValues(name, topic).Inc()
		m.duration.WithLabelValues(name, topic).Observe(max(e.Duration.Seconds(), 0))
		// Age is the relay's clock against the server's: a skew can make
		// it negative.
		m.age.WithLabelValues(name, topic).Observe(max(e.Age.Seconds(), 0))
	case relay.EventRetried:
		m.retried.WithLabelValues(name, m.topicLabel(e.Topic)).Inc()
	case relay.EventDead:
		m.dead.WithLabelValues(name, m.topicLabel(e.Topic)).Inc()
	case relay.EventReclaimed:
		m.reclaimed.WithLabelValues(name, m.topicLabel(e.Topic)).Inc()
	case relay.EventFenced:
		m.fenced.WithLabelValues(name, m.topicLabel(e.Topic)).Inc()
	case relay.EventExtended:
		m.extended.WithLabelValues(name).Add(float64(max(e.Count, 0)))
	case relay.EventReleased:
		m.released.WithLabelValues(name).Add(float64(max(e.Count, 0)))
	case relay.EventClaimLost:
		m.claimLost.WithLabelValues(name, m.topicLabel(e.Topic)).Inc()
	case relay.EventRefused:
		m.refused.WithLabelValues(name, m.topicLabel(e.Topic)).Inc()
	case relay.EventUnreadable:
		m.unreadable.WithLabelValues(name, m.topicLabel(e.Topic)).Inc()
	case relay.EventSuspended:
		m.suspended.WithLabelValues(name, m.topicLabel(e.Topic)).Inc()
	case relay.EventCanceled:
		m.canceled.WithLabelValues(name, m.topicLabel(e.Topic)).Inc()
	}
}

func (m *relayMetrics) topicLabel(topic string) string {
	if m.topic != nil {
		topic = m.topic(topic)
	}
	return labelValue(topic)
}

// labelValue returns s as a label value Prometheus accepts: valid UTF-8
// (WithLabelValues panics otherwise, and would take the relay's goroutine
// with it). A relay's name (relay.WithName) can be any string; topics are
// UTF-8 (outbox.Enqueue refuses others), but WithTopicPattern's are not
// checked.
func labelValue(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// checkBuckets returns a copy of bounds, or panics, naming option, when
// there are none or they are not strictly increasing.
func checkBuckets(option string, bounds []float64) []float64 {
	if len(bounds) == 0 {
		panic(fmt.Sprintf("idemprom: %s needs at least one bound", option))
	}
	for i, b := range bounds {
		if math.IsNaN(b) || i > 0 && b <= bounds[i-1] {
			panic(fmt.Sprintf("idemprom: %s needs strictly increasing bounds, got %v", option, bounds))
		}
	}
	return append([]float64(nil), bounds...)
}
