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
