package relaytest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/internal/outboxtest"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/outbox/relay"
)

var publishTests = []test{
	{"MarksDoneOnce", testPublishesAndMarksDone},
	{"RelaysPartition", testRelaysPartition},
	{"OrderPerKeyUnderRetries", testOrderPerKeyUnderRetries},
	{"ScheduledAtItsTime", testScheduledAtItsTime},
	{"Purge", testPurge},
	{"LagReported", testLagReported},
}

// testPublishesAndMarksDone: what committed is published once each, with
// its topic, payload, headers, ordering key and first attempt, and marked
// done; the events say so.
func testPublishesAndMarksDone(t *testing.T, tg Target) {
	rec := outboxtest.NewRecorder()
	ids := enqueue(t, tg, "k1",
		outbox.Message{Topic: "payments.created", Payload: []byte(`{"id":1}`), Headers: map[string]string{"traceparent": "00-x"}},
		outbox.Message{Topic: "payments.audit", Payload: nil, OrderingKey: "pay-1"})
	ev := start(t, tg.NewRelay, rec, relay.WithName("r1"))
	if err := rec.AwaitIDs(10*time.Second, ids...); err != nil {
		t.Fatal(err)
	}
	ev.Await(t, 5*time.Second, "2 published events", func() bool { return len(ev.Of(relay.EventPublished)) == 2 })
	rec.ExpectOnceEach(t, ids)
	byID := map[string]outboxtest.Delivery{}
	for _, x := range rec.Deliveries() {
		byID[x.ID] = x
	}
	first, second := byID[ids[0]], byID[ids[1]]
	if first.Topic != "payments.created" || string(first.Payload) != `{"id":1}` || first.Headers["traceparent"] != "00-x" ||
		first.Attempt != 1 || first.OrderingKey != strings.TrimSuffix(ids[0], "/1") || first.EnqueuedAt.IsZero() {
		t.Errorf("first envelope %+v", first.Envelope)
	}
	if second.Topic != "payments.audit" || len(second.Payload) != 0 || second.OrderingKey != "pay-1" || len(second.Headers) != 0 {
		t.Errorf("second envelope %+v", second.Envelope)
	}
	for _, id := range ids {
		if r := mustRow(t, tg, id); r.State != lifecycle.Done || r.Attempts != 1 || r.ClaimedBy != "r1" || r.FinishedAt == nil {
			t.Errorf("row %s: %v", id, r)
		}
	}
	for _, e := range ev.Of(relay.EventPublished) {
		if e.Relay != "r1" || e.Attempt != 1 || e.Age <= 0 || e.Topic == "" {
			t.Errorf("published event %+v", e)
		}
	}
}

// testRelaysPartition: three relays on one table at once, two on the
// target's handle and one on a handle of its own (as another process):
// no message is presented by two at once, every one is delivered once
// and done.
func testRelaysPartition(t *testing.T, tg Target) {
	rec := outboxtest.NewRecorder()
	var evs []*events
	for i, newRelay := range []func(outbox.Sink, ...relay.Option) *relay.Relay{tg.NewRelay, tg.NewRelay, tg.NewPeerRelay} {
		evs = append(evs, start(t, newRelay, rec, relay.WithName(fmt.Sprintf("r%d", i)), relay.WithBatchSize(10),
			relay.WithConcurrency(4), relay.WithPollInterval(50*time.Millisecond)))
	}
	// Enqueued while the relays run.
	const records, perRecord = 40, 5
	ids := enqueueN(t, tg, "p", records, perRecord)
	if err := rec.AwaitIDs(30*time.Second, ids...); err != nil {
		t.Fatalf("%v: %d of %d delivered", err, len(rec.Counts()), len(ids))
	}
	if byID, byKey := rec.Overlaps(); byID != 0 || byKey != 0 {
		t.Errorf("presentations while the same ID (%d) or ordering key (%d) was in flight", byID, byKey)
	}
	rec.ExpectOnceEach(t, ids)
	published := func() int {
		n := 0
		for _, e := range evs {
			n += len(e.Of(relay.EventPublished))
		}
		return n
	}
	evs[0].Await(t, 5*time.Second, "published events", func() bool { return published() == len(ids) })
	var per []string
	for i, ev := range evs {
		per = append(per, fmt.Sprintf("r%d %d", i, len(ev.Of(relay.EventPublished))))
		if f := ev.Of(relay.EventFenced); len(f) > 0 {
			t.Errorf("relay %d: %d fenced marks", i, len(f))
		}
	}
	if st := statuses(t, tg); st[lifecycle.Done] != len(ids) || len(st) != 1 {
		t.Errorf("statuses %v, want %d done", st, len(ids))
	}
	t.Logf("published by relay: %s", strings.Join(per, ", "))
	reliability.Report(t, reliability.Result{Scenario: "outbox: three relays on one table", Store: tg.Engine,
		Operations: int64(len(ids)), Note: fmt.Sprintf("%d messages of %d records, each delivered once (%s; r2 on a handle of its own), none presented by two relays at once", len(ids), records, strings.Join(per, ", "))})
}

// testOrderPerKeyUnderRetries: messages of five payment keys, enqueued by
// concurrent transactions, published by two relays at once (one on a
// handle of its own) through a sink that fails a third of the
// presentations: each key's messages are confirmed in the order of their
// rows (the order their transactions committed in), never two of a key
// at once, each once.
func testOrderPerKeyUnderRetries(t *testing.T, tg Target) {
	rec := outboxtest.NewRecorder()
	var mu sync.Mutex
	rnd := rand.New(rand.NewPCG(1, 2))
	failed := 0
	rec.FailWith(func(outbox.Envelope) error {
		mu.Lock()
		defer mu.Unlock()
		if rnd.IntN(3) == 0 {
			failed++
			return errors.New("flaky broker")
		}
		return nil
	})
	for i, newRelay := range []func(outbox.Sink, ...relay.Option) *relay.Relay{tg.NewRelay, tg.NewPeerRelay} {
		start(t, newRelay, rec, relay.WithName(fmt.Sprintf("r%d", i)), relay.WithConcurrency(4),
			relay.WithBackoff(time.Millisecond, 5*time.Millisecond), relay.WithMaxAttempts(100), relay.WithPollInterval(50*time.Millisecond))
	}
	keys := []string{"pay-a", "pay-b", "pay-c", "pay-d", "pay-e"}
	var wg sync.WaitGroup
	var all []string
	var allMu sync.Mutex
	for w := range 4 {
		wg.Go(func() {
			for i := range 6 {
				msgs := make([]outbox.Message, len(keys))
				for k, key := range keys {
					msgs[k] = outbox.Message{Topic: "payments", OrderingKey: key, Payload: fmt.Appendf(nil, "%d-%d", w, i)}
				}
				ids, err := tryEnqueue(ctx, tg, fmt.Sprintf("w%d-%d", w, i), msgs...)
				if err != nil {
					t.Error(err)
					return
				}
				allMu.Lock()
				all = append(all, ids...)
				allMu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := rec.AwaitIDs(60*time.Second, all...); err != nil {
		t.Fatalf("%v: %d of %d delivered", err, len(rec.Counts()), len(all))
	}
	rec.ExpectOnceEach(t, all)
	if byID, byKey := rec.Overlaps(); byID != 0 || byKey != 0 {
		t.Errorf("presentations while the same ID (%d) or ordering key (%d) was in flight", byID, byKey)
	}
	order := rowIDs(t, tg, all)
	last := map[string]int64{}
	for _, d := range rec.Deliveries() {
		if n := order[d.ID]; n < last[d.OrderingKey] {
			t.Errorf("key %s: %s (row %d) confirmed after row %d", d.OrderingKey, d.ID, n, last[d.OrderingKey])
		} else {
			last[d.OrderingKey] = n
		}
	}
	t.Logf("%d messages on %d keys, %d failed presentations", len(all), len(keys), failed)
	reliability.Report(t, reliability.Result{Scenario: "outbox: order per key under retries", Store: tg.Engine,
		Operations: int64(len(all) + failed), Faults: int64(failed),
		Note: fmt.Sprintf("%d messages on 5 keys from 4 concurrent writers, 2 relays; %d publishes failed and were retried; every key in commit order, each message once", len(all), failed)})
}

// rowIDs returns the row of each of the messages ids: the order in which
// the relays present those of an ordering key.
func rowIDs(t *testing.T, tg Target, ids []string) map[string]int64 {
	t.Helper()
	found, err := tg.Table.Lookup(ctx, tg.DB, ids)
	if err != nil {
		t.Fatal(err)
	}
	order := make(map[string]int64, len(found))
	for id, f := range found {
		order[id] = f.RowID
	}
	return order
}

// testScheduledAtItsTime: a message enqueued with a NotBefore is not
// presented before it, and a relay that polls once a minute presents it
// as it falls due, the later message of its key after it.
func testScheduledAtItsTime(t *testing.T, tg Target) {
	rec := outboxtest.NewRecorder()
	start(t, tg.NewRelay, rec, relay.WithPollInterval(time.Minute))
	notBefore := time.Now().Add(400 * time.Millisecond)
	ids := enqueue(t, tg, "later", outbox.Message{Topic: "reminders", NotBefore: notBefore}, outbox.Message{Topic: "after"})
	if r := mustRow(t, tg, ids[0]); r.State != lifecycle.Scheduled {
		t.Fatalf("enqueued with a NotBefore: %v, want scheduled", r)
	}
	if err := rec.AwaitIDs(10*time.Second, ids...); err != nil {
		t.Fatal(err)
	}
	d := rec.Deliveries()
	if d[0].ID != ids[0] || d[1].ID != ids[1] {
		t.Errorf("published %s, %s: the later message of the key went first", d[0].ID, d[1].ID)
	}
	if d[0].At.Before(notBefore) {
		t.Errorf("published at %v, before its NotBefore %v", d[0].At, notBefore)
	}
	if late := d[0].At.Sub(notBefore); late > time.Second {
		t.Errorf("published %v after its NotBefore: the relay did not wake for it", late)
	}
}

// testPurge: done and dead messages past the retention are purged; those
// not finished (scheduled, suspended) never, however old.
func testPurge(t *testing.T, tg Target) {
	scheduled := enqueue(t, tg, "scheduled", outbox.Message{Topic: "later", NotBefore: time.Now().Add(time.Hour)})[0]
	suspended := enqueue(t, tg, "suspended", outbox.Message{Topic: "held"})[0]
	if got, err := tg.Table.Suspend(ctx, tg.DB, lifecycle.Selector{IDs: []string{suspended}}, "held by the test"); err != nil || len(got) != 1 {
		t.Fatalf("suspend: %+v, %v", got, err)
	}
	done := enqueueN(t, tg, "done", 3, 1)
	dead := enqueue(t, tg, "dead", outbox.Message{Topic: "poison"})[0]
	rec := outboxtest.NewRecorder()
	rec.FailWith(func(e outbox.Envelope) error {
		if e.Topic == "poison" {
			return errors.New("refused")
		}
		return nil
	})
	ev := start(t, tg.NewRelay, rec, relay.WithMaxAttempts(1), relay.WithRetention(100*time.Millisecond), relay.WithPollInterval(50*time.Millisecond))
	ev.Await(t, 10*time.Second, "4 purged", func() bool {
		n := 0
		for _, e := range ev.Of(relay.EventPurged) {
			n += e.Count
		}
		return n == 4
	})
	for _, id := range append(done, dead) {
		if _, ok := rowOf(t, tg, id); ok {
			t.Errorf("%s not purged", id)
		}
	}
	for id, want := range map[string]lifecycle.State{scheduled: lifecycle.Scheduled, suspended: lifecycle.Suspended} {
		if r, ok := rowOf(t, tg, id); !ok || r.State != want {
			t.Errorf("the %s message: %v, %v", want, r, ok)
		}
	}
}

// testLagReported: the lag is how long the earliest due message has been
// waiting (here behind an earlier message of its key that another relay
// holds), 0 once none is due.
func testLagReported(t *testing.T, tg Target) {
	ids := enqueue(t, tg, "k", outbox.Message{Topic: "first"}, outbox.Message{Topic: "second"})
	// Another relay holds the first message; the second has been due for
	// 90 seconds.
	held, err := tg.Table.Claim(ctx, tg.DB, "held", "other", time.Hour, 10)
	if err != nil || len(held) != 1 || held[0].ID != ids[0] {
		t.Fatalf("the other relay's claim: %+v, %v; want %s alone", held, err, ids[0])
	}
	if got, err := tg.Table.Schedule(ctx, tg.DB, ids[1:], lifecycle.When{At: time.Now().Add(-90 * time.Second)}); err != nil || len(got) != 1 || got[0].State != lifecycle.Ready {
		t.Fatalf("schedule: %+v, %v", got, err)
	}
	rec := outboxtest.NewRecorder()
	ev := start(t, tg.NewRelay, rec, relay.WithPollInterval(50*time.Millisecond))
	ev.Await(t, 10*time.Second, "a lag of 90s", func() bool {
		return slices.ContainsFunc(ev.Of(relay.EventLag), func(e relay.Event) bool { return e.Lag >= 90*time.Second && e.Lag < 100*time.Second })
	})
	if rec.Count(ids[1]) != 0 {
		t.Fatal("the second message was presented while the first was claimed")
	}
	// The other relay finishes the first message.
	if marked, err := tg.Table.Done(ctx, tg.DB, "held", []int64{held[0].RowID}); err != nil || len(marked) != 1 {
		t.Fatalf("the other relay's done mark: %v, %v", marked, err)
	}
	if err := rec.AwaitIDs(10*time.Second, ids[1]); err != nil {
		t.Fatal(err)
	}
	ev.Await(t, 10*time.Second, "a lag of 0", func() bool {
		lags := ev.Of(relay.EventLag)
		return lags[len(lags)-1].Lag == 0
	})
}
