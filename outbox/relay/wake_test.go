package relay_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency/internal/outboxtest"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/relay"
)

// latencies enqueues n records of one message, one after the other, and
// returns the time from each commit (the call's return) to its delivery.
func latencies(t *testing.T, db *outboxtest.DB, rec *outboxtest.Recorder, n int) []time.Duration {
	t.Helper()
	var out []time.Duration
	for i := range n {
		id := db.Enqueue(t, fmt.Sprintf("lat-%d", i), outbox.Message{Topic: "t"})[0]
		committed := time.Now()
		if err := rec.AwaitIDs(10*time.Second, id); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		d := rec.Deliveries()
		out = append(out, d[len(d)-1].At.Sub(committed))
	}
	slices.Sort(out)
	return out
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	return sorted[min(len(sorted)-1, int(float64(len(sorted))*p))]
}

// TestNotifyWakesRelay: with a poll interval of a minute, a relay is woken
// by the notification of each commit: the time from commit to publish is
// milliseconds.
func TestNotifyWakesRelay(t *testing.T) {
	db := outboxtest.NewDB(t)
	rec := outboxtest.NewRecorder()
	start(t, db.Pool, rec, relay.WithPollInterval(time.Minute))
	// The first message waits for the listener to connect; measure after.
	if err := rec.AwaitIDs(10*time.Second, db.Enqueue(t, "warm-up", outbox.Message{Topic: "t"})...); err != nil {
		t.Fatal(err)
	}
	lat := latencies(t, db, rec, 200)
	p50, p99 := percentile(lat, 0.50), percentile(lat, 0.99)
	t.Logf("commit to publish over 200 messages: p50 %v, p99 %v, max %v", p50, p99, lat[len(lat)-1])
	if p99 > time.Second {
		t.Errorf("p99 %v: the relay was not woken by the notifications", p99)
	}
	reliability.Report(t, reliability.Result{Scenario: "outbox: LISTEN/NOTIFY wakes the relay", Store: "postgres",
		Operations: 200, Note: fmt.Sprintf("poll interval 1 min; commit to publish p50 %v, p99 %v, max %v",
			p50.Round(10*time.Microsecond), p99.Round(10*time.Microsecond), lat[len(lat)-1].Round(10*time.Microsecond))})
}

// TestPollingWithoutNotifications: a relay whose listening connection
// never connects (its notifications are all lost) still delivers every
// message, within its poll interval.
func TestPollingWithoutNotifications(t *testing.T) {
	db := outboxtest.NewDB(t)
	rec := outboxtest.NewRecorder()
	nowhere, err := pgx.ParseConfig("postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	const poll = 100 * time.Millisecond
	start(t, db.Pool, rec, relay.WithPollInterval(poll), relay.WithListenerConfig(nowhere))
	lat := latencies(t, db, rec, 20)
	p50, max := percentile(lat, 0.5), lat[len(lat)-1]
	t.Logf("commit to publish by polling alone: p50 %v, max %v", p50, max)
	if max > poll+time.Second {
		t.Errorf("max %v, over the poll interval %v", max, poll)
	}
	reliability.Report(t, reliability.Result{Scenario: "outbox: notifications lost, polling delivers", Store: "postgres",
		Operations: 20, Faults: 1, Note: fmt.Sprintf("listener never connected, poll interval 100ms: 20 of 20 delivered, p50 %v, max %v", p50.Round(time.Millisecond), max.Round(time.Millisecond))})
}
