package idemprom_test

import (
	"bytes"
	"context"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/go-idempotency/idempotency"
	idemprom "github.com/go-idempotency/idempotency/adapters/prometheus"
	"github.com/go-idempotency/idempotency/internal/outboxtest"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/relay"
)

// Distinctive parts of the events that no metric may carry: a message's ID
// (its record's storage key) and an error's text.
var (
	msgSecret = outbox.ID(idempotency.StorageKey("", "cust8841rawkey-relay"), 3)
	errSecret = errors.New("dial tcp 10.0.0.7:4222: broker7secret refused")
)

// relayEvents is what two relays report (see outboxtest.RelayEvents).
func relayEvents() []relay.Event { return outboxtest.RelayEvents(msgSecret, errSecret) }

// TestRelayObserver drives the observer with the events of two relays and
// checks every metric's series, values and labels, the histograms' sums
// and buckets, and that no message ID or error text reaches the page.
func TestRelayObserver(t *testing.T) {
	reg := prometheus.NewRegistry()
	observe := idemprom.RelayObserver(reg)
	for _, e := range relayEvents() {
		observe(context.Background(), e)
	}

	expectSeries(t, reg, "idempotency_outbox_lag_seconds", map[string]float64{"relay=a": 0, "relay=b": 0.25})
	expectSeries(t, reg, "idempotency_outbox_claimed_total", map[string]float64{"relay=a": 6, "relay=b": 1})
	expectSeries(t, reg, "idempotency_outbox_published_total", map[string]float64{
		"relay=a,topic=payments.captured": 2,
		"relay=a,topic=orders.created":    1,
		"relay=b,topic=orders.created":    1,
	})
	expectSeries(t, reg, "idempotency_outbox_retried_total", map[string]float64{"relay=a,topic=payments.captured": 2})
	expectSeries(t, reg, "idempotency_outbox_dead_total", map[string]float64{
		"relay=a,topic=payments.captured": 1,
		"relay=b,topic=orders.created":    1,
	})
	expectSeries(t, reg, "idempotency_outbox_reclaimed_total", map[string]float64{"relay=b,topic=orders.created": 1})
	expectSeries(t, reg, "idempotency_outbox_fenced_total", map[string]float64{"relay=a,topic=orders.created": 1})
	expectSeries(t, reg, "idempotency_outbox_purged_total", map[string]float64{"relay=b": 1017})
	expectSeries(t, reg, "idempotency_outbox_errors_total", map[string]float64{"relay=a": 1})
	expectSeries(t, reg, "idempotency_outbox_extended_total", map[string]float64{"relay=a": 5})
	expectSeries(t, reg, "idempotency_outbox_released_total", map[string]float64{"relay=b": 4})
	expectSeries(t, reg, "idempotency_outbox_claim_lost_total", map[string]float64{"relay=b,topic=orders.created": 1})
	expectSeries(t, reg, "idempotency_outbox_refused_total", map[string]float64{"relay=a,topic=payments.captured": 1})
	expectSeries(t, reg, "idempotency_outbox_unreadable_total", map[string]float64{"relay=b,topic=orders.created": 1})
	expectSeries(t, reg, "idempotency_outbox_suspended_total", map[string]float64{"relay=a,topic=payments.captured": 1})
	expectSeries(t, reg, "idempotency_outbox_canceled_total", map[string]float64{"relay=b,topic=orders.created": 1})
	// Only published messages are observed, once each.
	histograms := map[string]float64{
		"relay=a,topic=payments.captured": 2,
		"relay=a,topic=orders.created":    1,
		"relay=b,topic=orders.created":    1,
	}
	expectSeries(t, reg, "idempotency_outbox_publish_duration_seconds", histograms)
	expectSeries(t, reg, "idempotency_outbox_age_seconds", histograms)

	h := histogram(t, reg, "idempotency_outbox_publish_duration_seconds", "a", "payments.captured")
	if got := h.GetSampleSum(); math.Abs(got-0.1) > 1e-9 {
		t.Errorf("publish duration sum %v, want 0.1", got)
	}
	if got := bounds(h); !reflect.DeepEqual(got, idemprom.DefaultBuckets) {
		t.Errorf("publish duration bounds %v, want DefaultBuckets", got)
	}
	h = histogram(t, reg, "idempotency_outbox_age_seconds", "a", "payments.captured")
	if got := h.GetSampleSum(); math.Abs(got-2.03) > 1e-9 {
		t.Errorf("age sum %v, want 2.03", got)
	}
	if got := bounds(h); !reflect.DeepEqual(got, idemprom.DefaultAgeBuckets) {
		t.Errorf("age bounds %v, want DefaultAgeBuckets", got)
	}
	if got := cumulative(h, 0.05); got != 1 {
		t.Errorf("ages up to 50ms: %d, want 1", got)
	}
	if got := cumulative(h, 2.5); got != 2 {
		t.Errorf("ages up to 2.5s: %d, want 2", got)
	}
	// A negative age (clock skew) is observed as 0, not subtracted.
	h = histogram(t, reg, "idempotency_outbox_age_seconds", "a", "orders.created")
	if h.GetSampleSum() != 0 || cumulative(h, idemprom.DefaultAgeBuckets[0]) != 1 {
		t.Errorf("negative age: sum %v, first bucket %d, want 0 and 1", h.GetSampleSum(), cumulative(h, idemprom.DefaultAgeBuckets[0]))
	}
	if got := cumulative(histogram(t, reg, "idempotency_outbox_age_seconds", "b", "orders.created"), 300); got != 0 {
		t.Errorf("a 7 minute age is in the 5 minute bucket: %d", got)
	}

	// The same through testutil, in the exposition format with its help
	// and types.
	const want = `
# HELP idempotency_outbox_lag_seconds How long the earliest due outbox message has been waiting (0 when none is due), as the relay last read it.
# TYPE idempotency_outbox_lag_seconds gauge
idempotency_outbox_lag_seconds{relay="a"} 0
idempotency_outbox_lag_seconds{relay="b"} 0.25
# HELP idempotency_outbox_dead_total Outbox messages dead after their last allowed attempt (a failed publish or a claim that ran out).
# TYPE idempotency_outbox_dead_total counter
idempotency_outbox_dead_total{relay="a",topic="payments.captured"} 1
idempotency_outbox_dead_total{relay="b",topic="orders.created"} 1
# HELP idempotency_outbox_purged_total Finished outbox messages deleted past the retention.
# TYPE idempotency_outbox_purged_total counter
idempotency_outbox_purged_total{relay="b"} 1017
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idempotency_outbox_lag_seconds", "idempotency_outbox_dead_total", "idempotency_outbox_purged_total"); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 2+2+3+1+2+1+1+1+1+1+1+1+1+1+1+1+3+3 {
		t.Errorf("series: %d (%v), want 27", n, err)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}

	page := exposition(t, reg)
	for _, s := range []string{msgSecret, idempotency.StorageKey("", "cust8841rawkey-relay"), "broker7secret", "10.0.0.7", "budget exhausted"} {
		if strings.Contains(page, s) {
			t.Errorf("the page carries %q:\n%s", s, page)
		}
	}
}

// TestRelayObserverCountsEveryKind: an event of each kind the relay
// reports changes a metric; a kind added without a metric fails here.
func TestRelayObserverCountsEveryKind(t *testing.T) {
	for _, kind := range relay.EventKinds() {
		reg := prometheus.NewRegistry()
		idemprom.RelayObserver(reg)(context.Background(), relay.Event{Kind: kind, Relay: "r", Topic: "t", Count: 1, Lag: time.Second, Duration: time.Second})
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		changed := false
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				if m.GetCounter().GetValue() > 0 || m.GetGauge().GetValue() > 0 || m.GetHistogram().GetSampleCount() > 0 {
					changed = true
				}
			}
		}
		if !changed {
			t.Errorf("an event of kind %s changes no metric", kind)
		}
	}
}

// TestRelayObserverOptions checks the namespace, the constant labels, both
// histograms' buckets and the topic pattern, and that a relay name or topic
// that is not UTF-8 is reported instead of panicking.
func TestRelayObserverOptions(t *testing.T) {
	reg := prometheus.NewRegistry()
	observe := idemprom.RelayObserver(reg,
		idemprom.WithNamespace("shop"),
		idemprom.WithConstLabels(prometheus.Labels{"service": "payments"}),
		idemprom.WithBuckets(0.01, 0.1),
		idemprom.WithAgeBuckets(1, 60),
		idemprom.WithTopicPattern(func(topic string) string {
			if strings.HasPrefix(topic, "orders.") {
				return "orders.*"
			}
			return topic
		}))
	for _, id := range []string{"8841", "8842", "8843"} {
		observe(context.Background(), relay.Event{Kind: relay.EventPublished, Relay: "r", Topic: "orders." + id,
			Duration: 50 * time.Millisecond, Age: 30 * time.Second})
	}
	observe(context.Background(), relay.Event{Kind: relay.EventRetried, Relay: "r", Topic: "orders.8844"})
	observe(context.Background(), relay.Event{Kind: relay.EventRetried, Relay: "r", Topic: "bad\xfftopic"}) // as the pattern returns it
	observe(context.Background(), relay.Event{Kind: relay.EventLag, Relay: "bad\xffname", Lag: time.Second})

	expectSeries(t, reg, "shop_idempotency_outbox_published_total", map[string]float64{"relay=r,service=payments,topic=orders.*": 3})
	expectSeries(t, reg, "shop_idempotency_outbox_retried_total", map[string]float64{
		"relay=r,service=payments,topic=orders.*":       1,
		"relay=r,service=payments,topic=bad\uFFFDtopic": 1,
	})
	expectSeries(t, reg, "shop_idempotency_outbox_lag_seconds", map[string]float64{"relay=bad\uFFFDname,service=payments": 1})

	h := histogram(t, reg, "shop_idempotency_outbox_publish_duration_seconds", "r", "orders.*")
	if got := bounds(h); !reflect.DeepEqual(got, []float64{0.01, 0.1}) || cumulative(h, 0.01) != 0 || cumulative(h, 0.1) != 3 {
		t.Errorf("publish duration bounds %v, want [0.01 0.1] with 0 and 3", got)
	}
	h = histogram(t, reg, "shop_idempotency_outbox_age_seconds", "r", "orders.*")
	if got := bounds(h); !reflect.DeepEqual(got, []float64{1, 60}) || cumulative(h, 1) != 0 || cumulative(h, 60) != 3 {
		t.Errorf("age bounds %v, want [1 60] with 0 and 3", got)
	}
}

// TestBothObserversOneRegistry checks that Observer and RelayObserver
// register into one registry without colliding.
func TestBothObserversOneRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	idemprom.Observer(reg)(context.Background(), idempotency.Event{Kind: idempotency.EventExecuted, Route: "POST /p", Method: "POST", Final: true})
	idemprom.RelayObserver(reg)(context.Background(), relay.Event{Kind: relay.EventPublished, Relay: "r", Topic: "t"})
	expectSeries(t, reg, "idempotency_requests_total", map[string]float64{"method=POST,outcome=executed,route=POST /p": 1})
	expectSeries(t, reg, "idempotency_outbox_published_total", map[string]float64{"relay=r,topic=t": 1})
}

// TestDefaultAgeBuckets checks the default bounds are what the
// documentation says: increasing, from 5 milliseconds to an hour.
func TestDefaultAgeBuckets(t *testing.T) {
	b := idemprom.DefaultAgeBuckets
	if b[0] != 0.005 || b[len(b)-1] != 3600 {
		t.Errorf("DefaultAgeBuckets = %v", b)
	}
	for i := 1; i < len(b); i++ {
		if b[i] <= b[i-1] {
			t.Errorf("DefaultAgeBuckets = %v: not increasing", b)
		}
	}
}

// histogram returns the histogram of the family name for relay and topic.
func histogram(t *testing.T, reg prometheus.Gatherer, name, relayName, topic string) *dto.Histogram {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["relay"] == relayName && labels["topic"] == topic {
				return m.GetHistogram()
			}
		}
	}
	t.Fatalf("%s: no series of relay %q and topic %q", name, relayName, topic)
	return nil
}

func bounds(h *dto.Histogram) []float64 {
	var out []float64
	for _, b := range h.GetBucket() {
		out = append(out, b.GetUpperBound())
	}
	return out
}

// cumulative returns the count of observations up to le.
func cumulative(h *dto.Histogram, le float64) uint64 {
	for _, b := range h.GetBucket() {
		if b.GetUpperBound() == le {
			return b.GetCumulativeCount()
		}
	}
	return math.MaxUint64
}

// exposition returns reg's metrics in the text format.
func exposition(t *testing.T, reg prometheus.Gatherer) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			t.Fatal(err)
		}
	}
	return buf.String()
}

// TestRelayObserverConcurrent reports from many goroutines at once, as a
// relay with relay.WithConcurrency does, and checks every message counted.
func TestRelayObserverConcurrent(t *testing.T) {
	reg := prometheus.NewRegistry()
	observe := idemprom.RelayObserver(reg)
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
	expectSeries(t, reg, "idempotency_outbox_published_total", map[string]float64{"relay=r,topic=a": workers * each / 2, "relay=r,topic=b": workers * each / 2})
}
