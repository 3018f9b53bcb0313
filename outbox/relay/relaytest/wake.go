package relaytest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/internal/outboxtest"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/relay"
)

var wakeTests = []test{
	{"CommitWakesRelay", testCommitWakesRelay},
}

// testCommitWakesRelay: with a poll interval of a minute, a relay is
// woken by each commit of messages (PostgreSQL's notifications, a wake-up
// in process where the engine has none): the time from commit to publish
// is milliseconds.
func testCommitWakesRelay(t *testing.T, tg Target) {
	rec := outboxtest.NewRecorder()
	ev := start(t, tg.NewRelay, rec, relay.WithPollInterval(time.Minute))
	// The first message may wait for the relay to start listening;
	// measure after.
	if err := rec.AwaitIDs(10*time.Second, enqueue(t, tg, "warm-up", outbox.Message{Topic: "t"})...); err != nil {
		t.Fatal(err)
	}
	const n = 50
	lat := make([]time.Duration, 0, n)
	for i := range n {
		// Each commit comes once the relay is idle: it marked the last
		// message, read its state (EventLag), and waits once its next
		// claim found nothing.
		ev.Await(t, 10*time.Second, "the relay idle", func() bool { return ev.after(relay.EventPublished, i+1, relay.EventLag) })
		time.Sleep(10 * time.Millisecond)
		id := enqueue(t, tg, fmt.Sprintf("lat-%d", i), outbox.Message{Topic: "t"})[0]
		committed := time.Now()
		if err := rec.AwaitIDs(10*time.Second, id); err != nil {
			t.Fatalf("message %d, committed while the relay was idle: %v", i, err)
		}
		d := rec.Deliveries()
		lat = append(lat, d[len(d)-1].At.Sub(committed))
	}
	slices.Sort(lat)
	p50, p90 := lat[n/2], lat[n*9/10]
	t.Logf("commit to publish over %d messages: p50 %v, p90 %v, max %v", n, p50, p90, lat[n-1])
	if p90 > time.Second {
		t.Errorf("p90 %v: the relay was not woken by the commits", p90)
	}
	reliability.Report(t, reliability.Result{Scenario: "outbox: a commit wakes the relay", Store: tg.Engine,
		Operations: n, Note: fmt.Sprintf("poll interval 1 min; commit to publish p50 %v, p90 %v, max %v",
			p50.Round(10*time.Microsecond), p90.Round(10*time.Microsecond), lat[n-1].Round(10*time.Microsecond))})
}
