package idemotel_test

import (
	"context"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/go-idempotency/idempotency"
	idemotel "github.com/go-idempotency/idempotency/adapters/otel"
	"github.com/go-idempotency/idempotency/internal/outboxtest"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/relay"
)

// Distinctive parts of the events that no metric may carry: a message's ID
// (its record's storage key) and an error's text.
var (
	msgSecret = outbox.ID(idempotency.StorageKey("", "raw-key-relay"), 3)
	errSecret = errors.New("dial tcp 10.0.0.7:4222: broker7secret refused")
)

// relayEvents is what two relays report (see outboxtest.RelayEvents).
func relayEvents() []relay.Event { return outboxtest.RelayEvents(msgSecret, errSecret) }

func byRelay(name string) string { return "idempotency.outbox.relay=" + name }

func byTopic(name, topic string) string {
	return "idempotency.outbox.relay=" + name + ",messaging.destination.name=" + topic
}

// histogramPoint returns the data point of the histogram name with the
// attributes attrs (as key encodes them).
func histogramPoint(t *testing.T, reader sdkmetric.Reader, name, attrs string) metricdata.HistogramDataPoint[float64] {
	t.Helper()
	m, ok := collect(t, reader)[name]
	if !ok {
		t.Fatalf("no %s", name)
	}
	for _, p := range m.Data.(metricdata.Histogram[float64]).DataPoints {
		if key(p.Attributes) == attrs {
			return p
		}
	}
	t.Fatalf("%s: no point %s", name, attrs)
	return metricdata.HistogramDataPoint[float64]{}
}

// TestRelayObserver drives the observer with the events of two relays and
// checks every instrument's data points, units and kinds, the histograms'
// sums and buckets, and that no attribute carries a message ID or an
// error's text.
func TestRelayObserver(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	observe := idemotel.RelayObserver(idemotel.WithMeterProvider(mp))
	for _, e := range relayEvents() {
		observe(context.Background(), e)
	}

	expectPoints(t, reader, "idempotency.outbox.lag", map[string]float64{byRelay("a"): 0, byRelay("b"): 0.25})
	expectPoints(t, reader, "idempotency.outbox.claimed", map[string]float64{byRelay("a"): 6, byRelay("b"): 1})
	expectPoints(t, reader, "idempotency.outbox.published", map[string]float64{
		byTopic("a", "payments.captured"): 2,
		byTopic("a", "orders.created"):    1,
		byTopic("b", "orders.created"):    1,
	})
	expectPoints(t, reader, "idempotency.outbox.retried", map[string]float64{byTopic("a", "payments.captured"): 2})
	expectPoints(t, reader, "idempotency.outbox.dead", map[string]float64{
		byTopic("a", "payments.captured"): 1,
		byTopic("b", "orders.created"):    1,
	})
	expectPoints(t, reader, "idempotency.outbox.reclaimed", map[string]float64{byTopic("b", "orders.created"): 1})
	expectPoints(t, reader, "idempotency.outbox.fenced", map[string]float64{byTopic("a", "orders.created"): 1})
	expectPoints(t, reader, "idempotency.outbox.purged", map[string]float64{byRelay("b"): 1017})
	expectPoints(t, reader, "idempotency.outbox.errors", map[string]float64{byRelay("a"): 1})
	expectPoints(t, reader, "idempotency.outbox.extended", map[string]float64{byRelay("a"): 5})
	expectPoints(t, reader, "idempotency.outbox.released", map[string]float64{byRelay("b"): 4})
	expectPoints(t, reader, "idempotency.outbox.claim_lost", map[string]float64{byTopic("b", "orders.created"): 1})
	expectPoints(t, reader, "idempotency.outbox.refused", map[string]float64{byTopic("a", "payments.captured"): 1})
	expectPoints(t, reader, "idempotency.outbox.unreadable", map[string]float64{byTopic("b", "orders.created"): 1})
	expectPoints(t, reader, "idempotency.outbox.suspended", map[string]float64{byTopic("a", "payments.captured"): 1})
	expectPoints(t, reader, "idempotency.outbox.canceled", map[string]float64{byTopic("b", "orders.created"): 1})
	// Only published messages are recorded, once each.
	histograms := map[string]float64{
		byTopic("a", "payments.captured"): 2,
		byTopic("a", "orders.created"):    1,
		byTopic("b", "orders.created"):    1,
	}
	expectPoints(t, reader, "idempotency.outbox.publish.duration", histograms)
	expectPoints(t, reader, "idempotency.outbox.age", histograms)

	p := histogramPoint(t, reader, "idempotency.outbox.publish.duration", byTopic("a", "payments.captured"))
	if math.Abs(p.Sum-0.1) > 1e-9 || !reflect.DeepEqual(p.Bounds, idemotel.DefaultBuckets) {
		t.Errorf("publish duration: sum %v, bounds %v; want 0.1 and DefaultBuckets", p.Sum, p.Bounds)
	}
	p = histogramPoint(t, reader, "idempotency.outbox.age", byTopic("a", "payments.captured"))
	if math.Abs(p.Sum-2.03) > 1e-9 || !reflect.DeepEqual(p.Bounds, idemotel.DefaultAgeBuckets) {
		t.Errorf("age: sum %v, bounds %v; want 2.03 and DefaultAgeBuckets", p.Sum, p.Bounds)
	}
	// 30ms in (25ms, 50ms], 2s in (1s, 2.5s].
	want := make([]uint64, len(idemotel.DefaultAgeBuckets)+1)
	want[3], want[8] = 1, 1
	if !reflect.DeepEqual(p.BucketCounts, want) {
		t.Errorf("age buckets %v, want %v", p.BucketCounts, want)
	}
	// A negative age (clock skew) is recorded as 0, not subtracted.
	p = histogramPoint(t, reader, "idempotency.outbox.age", byTopic("a", "orders.created"))
	if p.Sum != 0 || p.BucketCounts[0] != 1 {
		t.Errorf("negative age: sum %v, buckets %v; want 0 in the first", p.Sum, p.BucketCounts)
	}
	if p := histogramPoint(t, reader, "idempotency.outbox.age", byTopic("b", "orders.created")); p.BucketCounts[14] != 1 {
		t.Errorf("7 minutes: buckets %v, want one in (5m, 15m]", p.BucketCounts)
	}

	all := collect(t, reader)
	for name, want := range map[string]struct {
		unit string
		data any
	}{
		"idempotency.outbox.lag":              {"s", metricdata.Gauge[float64]{}},
		"idempotency.outbox.claimed":          {"{message}", metricdata.Sum[int64]{}},
		"idempotency.outbox.published":        {"{message}", metricdata.Sum[int64]{}},
		"idempotency.outbox.retried":          {"{message}", metricdata.Sum[int64]{}},
		"idempotency.outbox.dead":             {"{message}", metricdata.Sum[int64]{}},
		"idempotency.outbox.reclaimed":        {"{message}", metricdata.Sum[int64]{}},
		"idempotency.outbox.fenced":           {"{message}", metricdata.Sum[int64]{}},
		"idempotency.outbox.purged":           {"{message}", metricdata.Sum[int64]{}},
		"idempotency.outbox.errors":           {"{error}", metricdata.Sum[int64]{}},
		"idempotency.outbox.extended":         {"{message}", metricdata.Sum[int64]{}},
		"idempotency.outbox.released":         {"{message}", metricdata.Sum[int64]{}},
		"idempotency.outbox.claim_lost":       {"{message}", metricdata.Sum[int64]{}},
		"idempotency.outbox.refused":          {"{message}", metricdata.Sum[int64]{}},
		"idempotency.outbox.unreadable":       {"{message}", metricdata.Sum[int64]{}},
		"idempotency.outbox.suspended":        {"{message}", metricdata.Sum[int64]{}},
		"idempotency.outbox.canceled":         {"{message}", metricdata.Sum[int64]{}},
		"idempotency.outbox.publish.duration": {"s", metricdata.Histogram[float64]{}},
		"idempotency.outbox.age":              {"s", metricdata.Histogram[float64]{}},
	} {
		m, ok := all[name]
		if !ok {
			t.Errorf("no %s", name)
			continue
		}
		if m.Unit != want.unit || reflect.TypeOf(m.Data) != reflect.TypeOf(want.data) {
			t.Errorf("%s: unit %q, data %T; want %q, %T", name, m.Unit, m.Data, want.unit, want.data)
		}
		if sum, ok := m.Data.(metricdata.Sum[int64]); ok && (!sum.IsMonotonic || sum.Temporality != metricdata.CumulativeTemporality) {
			t.Errorf("%s: not a monotonic cumulative sum", name)
		}
	}
	if len(all) != 18 {
		t.Errorf("%d instruments, want 18", len(all))
	}

	storageKey := idempotency.StorageKey("", "raw-key-relay")
	for name, m := range all {
		for _, v := range attributeValues(m) {
			for _, secret := range []string{msgSecret, storageKey, "broker7secret", "10.0.0.7", "budget exhausted"} {
				if strings.Contains(v, secret) {
					t.Errorf("%s: attribute value %q carries %q", name, v, secret)
				}
			}
		}
	}
}

// TestRelayObserverCountsEveryKind: an event of each kind the relay
// reports records on an instrument; a kind added without one fails here.
func TestRelayObserverCountsEveryKind(t *testing.T) {
	for _, kind := range relay.EventKinds() {
		reader := sdkmetric.NewManualReader()
		observe := idemotel.RelayObserver(idemotel.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
		observe(context.Background(), relay.Event{Kind: kind, Relay: "r", Topic: "t", Count: 1, Lag: time.Second, Duration: time.Second})
		if len(collect(t, reader)) == 0 {
			t.Errorf("an event of kind %s records nothing", kind)
		}
	}
}

// TestRelayObserverOptions checks both histograms' buckets and the topic
// pattern, and that a relay name or topic that is not UTF-8 is recorded as
// valid UTF-8.
func TestRelayObserverOptions(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	observe := idemotel.RelayObserver(idemotel.WithMeterProvider(mp),
		idemotel.WithBuckets(0.01, 0.1),
		idemotel.WithAgeBuckets(1, 60),
		idemotel.WithTopicPattern(func(topic string) string {
			if strings.HasPrefix(topic, "orders.") {
				return "orders.*"
			}
			return topic
		}))
	for _, id := range []string{"8841", "8842", "8843"} {
		observe(context.Background(), relay.Event{Kind: relay.EventPublished, Relay: "r", Topic: "orders." + id,
			Duration: 50 * time.Millisecond, Age: 30 * time.Second})
	}
	observe(context.Background(), relay.Event{Kind: relay.EventDead, Relay: "r", Topic: "orders.8844"})
	observe(context.Background(), relay.Event{Kind: relay.EventDead, Relay: "r", Topic: "bad\xfftopic"}) // as the pattern returns it
	observe(context.Background(), relay.Event{Kind: relay.EventLag, Relay: "bad\xffname", Lag: time.Second})

	expectPoints(t, reader, "idempotency.outbox.published", map[string]float64{byTopic("r", "orders.*"): 3})
	expectPoints(t, reader, "idempotency.outbox.dead", map[string]float64{byTopic("r", "orders.*"): 1, byTopic("r", "bad\uFFFDtopic"): 1})
	expectPoints(t, reader, "idempotency.outbox.lag", map[string]float64{byRelay("bad\uFFFDname"): 1})
	p := histogramPoint(t, reader, "idempotency.outbox.publish.duration", byTopic("r", "orders.*"))
	if !reflect.DeepEqual(p.Bounds, []float64{0.01, 0.1}) || !reflect.DeepEqual(p.BucketCounts, []uint64{0, 3, 0}) {
		t.Errorf("publish duration: bounds %v with %v, want [0.01 0.1] with [0 3 0]", p.Bounds, p.BucketCounts)
	}
	p = histogramPoint(t, reader, "idempotency.outbox.age", byTopic("r", "orders.*"))
	if !reflect.DeepEqual(p.Bounds, []float64{1, 60}) || !reflect.DeepEqual(p.BucketCounts, []uint64{0, 3, 0}) {
		t.Errorf("age: bounds %v with %v, want [1 60] with [0 3 0]", p.Bounds, p.BucketCounts)
	}
}

// TestRelayGaugeLastValue checks that the lag gauge keeps the last value
// each relay reported, with the relay's name its only attribute.
func TestRelayGaugeLastValue(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	observe := idemotel.RelayObserver(idemotel.WithMeterProvider(mp))
	for _, lag := range []time.Duration{time.Second, 5 * time.Second, 1500 * time.Millisecond} {
		observe(context.Background(), relay.Event{Kind: relay.EventLag, Relay: "r", Lag: lag})
	}
	m := collect(t, reader)["idempotency.outbox.lag"]
	points := m.Data.(metricdata.Gauge[float64]).DataPoints
	if len(points) != 1 || points[0].Value != 1.5 || !points[0].Attributes.Equals(ptr(attribute.NewSet(idemotel.RelayKey.String("r")))) {
		t.Errorf("lag points %+v, want one of 1.5 for relay r", points)
	}
}

func ptr[T any](v T) *T { return &v }

// TestRelayObserverConcurrent reports from many goroutines at once, as a
// relay with relay.WithConcurrency does, and checks every message counted.
func TestRelayObserverConcurrent(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	observe := idemotel.RelayObserver(idemotel.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	const workers, each = 8, 100
	done := make(chan struct{})
	for w := range workers {
		go func() {
			defer func() { done <- struct{}{} }()
			for range each {
				observe(context.Background(), relay.Event{Kind: relay.EventPublished, Relay: "r", Topic: []string{"a", "b"}[w%2], Duration: time.Millisecond})
				observe(context.Background(), relay.Event{Kind: relay.EventLag, Relay: "r", Lag: time.Duration(w) * time.Second})
			}
		}()
	}
	for range workers {
		<-done
	}
	expectPoints(t, reader, "idempotency.outbox.published", map[string]float64{byTopic("r", "a"): workers * each / 2, byTopic("r", "b"): workers * each / 2})
}
