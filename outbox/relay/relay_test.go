package relay_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency/internal/outboxtest"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/outbox/relay"
)

var ctx = context.Background()

func wantPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Errorf("%s did not panic", what)
		}
	}()
	f()
}

// TestOptionsPanic: misconfiguration panics at construction.
func TestOptionsPanic(t *testing.T) {
	wantPanic(t, "WithBatchSize(0)", func() { relay.WithBatchSize(0) })
	wantPanic(t, "WithClaimLease(0)", func() { relay.WithClaimLease(0) })
	wantPanic(t, "WithBackoff(0, 1s)", func() { relay.WithBackoff(0, time.Second) })
	wantPanic(t, "WithBackoff(2s, 1s)", func() { relay.WithBackoff(2*time.Second, time.Second) })
	wantPanic(t, "WithMaxAttempts(0)", func() { relay.WithMaxAttempts(0) })
	wantPanic(t, "WithPollInterval(0)", func() { relay.WithPollInterval(0) })
	wantPanic(t, "WithRetention(-1s)", func() { relay.WithRetention(-time.Second) })
	wantPanic(t, "WithTable(a-b)", func() { relay.WithTable("a-b") })
	wantPanic(t, "WithConcurrency(0)", func() { relay.WithConcurrency(0) })
	wantPanic(t, `WithName("")`, func() { relay.WithName("") })
	wantPanic(t, "WithListenerConfig(nil)", func() { relay.WithListenerConfig(nil) })
	wantPanic(t, "WithObserver(nil)", func() { relay.WithObserver(nil) })
	wantPanic(t, "New(nil pool)", func() { relay.New(nil, outboxtest.NewRecorder()) })

	cfg, err := pgxpool.ParseConfig("postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	wantPanic(t, "New(nil sink)", func() { relay.New(pool, nil) })
	wantPanic(t, "New(nil option)", func() { relay.New(pool, outboxtest.NewRecorder(), nil) })
	if r := relay.New(pool, outboxtest.NewRecorder(), relay.WithName("r1")); r.Name() != "r1" {
		t.Errorf("Name() = %q", r.Name())
	}
	if r := relay.New(pool, outboxtest.NewRecorder()); strings.Count(r.Name(), "/") != 2 {
		t.Errorf("default name %q, want host/pid/random", r.Name())
	}
}

// TestPublishesAndMarksDone: what committed is published once each, with
// its topic, payload, headers, ordering key and first attempt, and marked
// done; the events say so.
func TestPublishesAndMarksDone(t *testing.T) {
	db := outboxtest.NewDB(t)
	rec := outboxtest.NewRecorder()
	ids := db.Enqueue(t, "k1",
		outbox.Message{Topic: "payments.created", Payload: []byte(`{"id":1}`), Headers: map[string]string{"traceparent": "00-x"}},
		outbox.Message{Topic: "payments.audit", Payload: nil, OrderingKey: "pay-1"})
	ev := start(t, db.Pool, rec, relay.WithName("r1"))
	if err := rec.AwaitIDs(10*time.Second, ids...); err != nil {
		t.Fatal(err)
	}
	ev.Await(t, 5*time.Second, "2 published events", func() bool { return len(ev.Of(relay.EventPublished)) == 2 })
	rec.ExpectOnceEach(t, ids)
	d := rec.Deliveries()
	byID := map[string]outboxtest.Delivery{}
	for _, x := range d {
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
		row, ok := db.Row(t, id)
		if !ok || row.Status != lifecycle.Done || row.Attempts != 1 || row.ClaimedBy == nil || *row.ClaimedBy != "r1" {
			t.Errorf("row %s: %+v %v", id, row, ok)
		}
	}
	for _, e := range ev.Of(relay.EventPublished) {
		if e.Relay != "r1" || e.Attempt != 1 || e.Age <= 0 || e.Topic == "" {
			t.Errorf("published event %+v", e)
		}
	}
}

// TestThreeRelaysPartition: three relays on one table at once, each with
// a pool of its own: no message is presented by two at once, every one is
// delivered once and done.
func TestThreeRelaysPartition(t *testing.T) {
	db := outboxtest.NewDB(t)
	rec := outboxtest.NewRecorder()
	var evs []*events
	for i := range 3 {
		pool := newPool(t, db.URL)
		evs = append(evs, start(t, pool, rec, relay.WithName(fmt.Sprintf("r%d", i)), relay.WithBatchSize(10), relay.WithConcurrency(4)))
	}
	// Enqueued while the relays run: each commit wakes all three.
	ids := enqueueN(t, db, "p", 200, 3)
	if err := rec.AwaitIDs(30*time.Second, ids...); err != nil {
		t.Fatalf("%v: %d of %d delivered", err, len(rec.Counts()), len(ids))
	}
	ids2, keys := rec.Overlaps()
	if ids2 != 0 || keys != 0 {
		t.Errorf("presentations while the same ID (%d) or ordering key (%d) was in flight", ids2, keys)
	}
	rec.ExpectOnceEach(t, ids)
	var per []string
	total := 0
	for i, ev := range evs {
		ev.Await(t, 5*time.Second, "published events", func() bool {
			n := 0
			for _, e := range evs {
				n += len(e.Of(relay.EventPublished))
			}
			return n == len(ids)
		})
		n := len(ev.Of(relay.EventPublished))
		total += n
		per = append(per, fmt.Sprintf("r%d %d", i, n))
		if f := ev.Of(relay.EventFenced); len(f) > 0 {
			t.Errorf("relay %d: %d fenced marks", i, len(f))
		}
	}
	if st := db.Statuses(t); st[lifecycle.Done] != len(ids) || len(st) != 1 {
		t.Errorf("statuses %v, want %d done", st, len(ids))
	}
	t.Logf("published by relay: %s", strings.Join(per, ", "))
	reliability.Report(t, reliability.Result{Scenario: "outbox: three relays on one table", Store: "postgres",
		Operations: int64(len(ids)), Note: fmt.Sprintf("%d messages of 200 records, each delivered once (%s), none presented by two relays at once", len(ids), strings.Join(per, ", "))})
}

func newPool(t testing.TB, url string, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range configure {
		c(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestFailingSinkBacksOffThenDead: a message the sink fails waits for a
// retry with a growing backoff, and is dead at the cap with the last error;
// the messages of other keys go on meanwhile.
func TestFailingSinkBacksOffThenDead(t *testing.T) {
	db := outboxtest.NewDB(t)
	rec := outboxtest.NewRecorder()
	rec.FailWith(func(e outbox.Envelope) error {
		if e.Topic == "poison" {
			return fmt.Errorf("broker refused attempt %d", e.Attempt)
		}
		return nil
	})
	poison := db.Enqueue(t, "bad", outbox.Message{Topic: "poison"})[0]
	good := enqueueN(t, db, "good", 5, 1)
	ev := start(t, db.Pool, rec, relay.WithMaxAttempts(4), relay.WithBackoff(20*time.Millisecond, 40*time.Millisecond))
	ev.Await(t, 10*time.Second, "the poison message dead", func() bool { return len(ev.Of(relay.EventDead)) == 1 })
	if err := rec.AwaitIDs(5*time.Second, good...); err != nil {
		t.Fatal(err)
	}
	retried := ev.Of(relay.EventRetried)
	if len(retried) != 3 {
		t.Fatalf("%d retried events, want 3", len(retried))
	}
	for i, e := range retried {
		lo, hi := 10*time.Millisecond<<i, 20*time.Millisecond<<i
		if i > 0 {
			lo, hi = 20*time.Millisecond, 40*time.Millisecond
		}
		if e.ID != poison || e.Attempt != i+1 || e.Backoff < lo || e.Backoff > hi || e.Err == nil {
			t.Errorf("retry %d: %+v, want attempt %d, backoff in [%v, %v]", i, e, i+1, lo, hi)
		}
	}
	dead := ev.Of(relay.EventDead)[0]
	if dead.ID != poison || dead.Attempt != 4 || dead.Reclaimed || dead.Err == nil || !strings.Contains(dead.Err.Error(), "attempt 4") {
		t.Errorf("dead event %+v", dead)
	}
	row, _ := db.Row(t, poison)
	if row.Status != lifecycle.Dead || row.Attempts != 4 || row.LastError == nil ||
		*row.LastError != relay.CodePublishFailed+": broker refused attempt 4" {
		t.Errorf("dead row %+v (last error %v)", row, deref(row.LastError))
	}
	if n := rec.Failures(poison); n != 4 {
		t.Errorf("%d presentations of the poison message, want 4", n)
	}
	reliability.Report(t, reliability.Result{Scenario: "outbox: a sink that refuses a message", Store: "postgres",
		Operations: 9, Faults: 4, Note: "3 retries with backoff (20ms doubling to 40ms, jittered), dead at the 4th attempt with its error; the other keys' 5 messages delivered meanwhile"})
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// TestSinkPanicIsAFailure: a sink that panics costs an attempt, recorded
// as sink_panicked; the relay goes on.
func TestSinkPanicIsAFailure(t *testing.T) {
	db := outboxtest.NewDB(t)
	var once sync.Once
	rec := outboxtest.NewRecorder()
	sink := outbox.SinkFunc(func(ctx context.Context, e outbox.Envelope) error {
		once.Do(func() { panic("sink bug") })
		return rec.Publish(ctx, e)
	})
	id := db.Enqueue(t, "k", outbox.Message{Topic: "t"})[0]
	ev := start(t, db.Pool, sink)
	if err := rec.AwaitIDs(10*time.Second, id); err != nil {
		t.Fatal(err)
	}
	r := ev.Of(relay.EventRetried)
	if len(r) != 1 || !strings.Contains(r[0].Err.Error(), "sink bug") {
		t.Fatalf("retried events %+v", r)
	}
	if d := rec.Deliveries(); d[0].Attempt != 2 {
		t.Errorf("delivered at attempt %d, want 2", d[0].Attempt)
	}
}

// TestOrderPerKeyUnderRetries: messages of five payment keys, enqueued by
// concurrent transactions, published by two relays at once through a sink
// that fails a third of the presentations: each key's messages are
// confirmed in the order of their ids (the order their transactions
// committed in), never two of a key at once, each once.
func TestOrderPerKeyUnderRetries(t *testing.T) {
	db := outboxtest.NewDB(t)
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
	for i := range 2 {
		start(t, newPool(t, db.URL), rec, relay.WithName(fmt.Sprintf("r%d", i)), relay.WithConcurrency(4),
			relay.WithBackoff(time.Millisecond, 5*time.Millisecond), relay.WithMaxAttempts(100))
	}
	keys := []string{"pay-a", "pay-b", "pay-c", "pay-d", "pay-e"}
	var wg sync.WaitGroup
	var all []string
	var allMu sync.Mutex
	for w := range 4 {
		wg.Go(func() {
			for i := range 15 {
				msgs := make([]outbox.Message, len(keys))
				for k, key := range keys {
					msgs[k] = outbox.Message{Topic: "payments", OrderingKey: key, Payload: fmt.Appendf(nil, "%d-%d", w, i)}
				}
				ids, err := db.TryEnqueue(ctx, fmt.Sprintf("w%d-%d", w, i), msgs...)
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
	if ids, keys := rec.Overlaps(); ids != 0 || keys != 0 {
		t.Errorf("presentations while the same ID (%d) or ordering key (%d) was in flight", ids, keys)
	}
	// The row id of each message: the order the relays must follow.
	order := map[string]int64{}
	rows, err := db.Pool.Query(ctx, `SELECT storage_key || '/' || seq, id FROM idempotency_outbox`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var n int64
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		order[id] = n
	}
	last := map[string]int64{}
	for _, d := range rec.Deliveries() {
		if n := order[d.ID]; n < last[d.OrderingKey] {
			t.Errorf("key %s: %s (row %d) confirmed after row %d", d.OrderingKey, d.ID, n, last[d.OrderingKey])
		} else {
			last[d.OrderingKey] = n
		}
	}
	t.Logf("%d messages on %d keys, %d failed presentations", len(all), len(keys), failed)
	reliability.Report(t, reliability.Result{Scenario: "outbox: order per key under retries", Store: "postgres",
		Operations: int64(len(all) + failed), Faults: int64(failed),
		Note: fmt.Sprintf("%d messages on 5 keys from 4 concurrent writers, 2 relays; %d publishes failed and were retried; every key in commit order, each message once", len(all), failed)})
}

// TestFencedAfterTakeover: a relay loses its database while its sink
// stalls (ignoring its context): its extends fail, so it cancels the
// sink's context (ErrClaimLost) before its claim could run out, and
// another relay takes the message back once it has and publishes it
// again. The first relay's mark, once its sink returns and its database
// is back, changes nothing.
func TestFencedAfterTakeover(t *testing.T) {
	db := outboxtest.NewDB(t)
	id := db.Enqueue(t, "k", outbox.Message{Topic: "t"})[0]
	stalled := make(chan struct{})
	resume := make(chan struct{})
	cause := make(chan error, 1)
	slow := outbox.SinkFunc(func(ctx context.Context, e outbox.Envelope) error {
		close(stalled)
		<-resume
		cause <- context.Cause(ctx)
		return nil
	})
	poolA, proxy := pgtest.ProxiedPool(t, db.URL)
	evA := start(t, poolA, slow, relay.WithName("a"), relay.WithClaimLease(300*time.Millisecond))
	<-stalled
	proxy.Stall() // a's extends get no answer
	evA.Await(t, 10*time.Second, "a's claim lost", func() bool { return len(evA.Of(relay.EventClaimLost)) == 1 })
	lostBy := time.Now()
	// The server's clock and this one are the same machine's.
	var until time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT claim_until FROM idempotency_outbox WHERE status = 'claimed'`).Scan(&until); err != nil {
		t.Fatal(err)
	}
	if !lostBy.Before(until) {
		t.Errorf("a gave its claim up at %v, not before it ran out at %v", lostBy, until)
	}
	fast := outboxtest.NewRecorder()
	evB := start(t, newPool(t, db.URL), fast, relay.WithName("b"), relay.WithClaimLease(300*time.Millisecond), relay.WithPollInterval(50*time.Millisecond))
	evB.Await(t, 10*time.Second, "b's publish", func() bool { return len(evB.Of(relay.EventPublished)) == 1 })
	if d := fast.Deliveries(); d[0].Attempt != 2 {
		t.Errorf("b presented attempt %d, want 2 (a's claim counted)", d[0].Attempt)
	}
	proxy.Restore()
	close(resume)
	if err := <-cause; !errors.Is(err, outbox.ErrClaimLost) {
		t.Errorf("a's sink context ended with %v, want a cause wrapping ErrClaimLost", err)
	}
	evA.Await(t, 10*time.Second, "a's fenced mark", func() bool { return len(evA.Of(relay.EventFenced)) == 1 })
	if f := evA.Of(relay.EventFenced)[0]; f.ID != id || !f.Published || f.State != lifecycle.Done {
		t.Errorf("fenced event %+v, want %s published, found done", f, id)
	}
	if l := evA.Of(relay.EventClaimLost)[0]; l.ID != id || !errors.Is(l.Err, outbox.ErrClaimLost) {
		t.Errorf("claim lost event %+v", l)
	}
	if len(evA.Of(relay.EventPublished)) != 0 {
		t.Error("a reported its stolen message as published")
	}
	row, _ := db.Row(t, id)
	if row.Status != lifecycle.Done || row.Attempts != 2 || deref(row.ClaimedBy) != "b" {
		t.Errorf("row %+v, want done by b after 2 attempts", row)
	}
	if fast.Count(id) != 1 {
		t.Errorf("b delivered %d times, want 1", fast.Count(id))
	}
	reliability.Report(t, reliability.Result{Scenario: "outbox: a relay cut from its database while its sink stalls", Store: "postgres",
		Operations: 2, Faults: 1, Note: "its extends failed: it cancelled the sink's context (ErrClaimLost) within the 300ms lease; taken back and published again by another relay (same ID, attempt 2); the first relay's mark fenced"})
}

// TestExpiredClaimAtTheCapIsDead: a claim that ran out on the last allowed
// attempt makes the message dead, with claim_expired.
func TestExpiredClaimAtTheCapIsDead(t *testing.T) {
	db := outboxtest.NewDB(t)
	id := db.Enqueue(t, "k", outbox.Message{Topic: "t"})[0]
	// A relay that died holding the claim of its second attempt.
	if _, err := db.Pool.Exec(ctx, `UPDATE idempotency_outbox SET status = 'claimed', claim_token = 'gone', claimed_by = 'dead-relay',
		claim_until = clock_timestamp() - interval '1 second', attempts = 1`); err != nil {
		t.Fatal(err)
	}
	rec := outboxtest.NewRecorder()
	ev := start(t, db.Pool, rec, relay.WithMaxAttempts(2))
	ev.Await(t, 10*time.Second, "dead", func() bool { return len(ev.Of(relay.EventDead)) == 1 })
	if d := ev.Of(relay.EventDead)[0]; d.ID != id || !d.Reclaimed || d.Attempt != 2 {
		t.Errorf("dead event %+v", d)
	}
	row, _ := db.Row(t, id)
	if row.Status != lifecycle.Dead || row.Attempts != 2 || !strings.HasPrefix(deref(row.LastError), relay.CodeClaimExpired+": the claim of dead-relay") {
		t.Errorf("row %+v, last error %s", row, deref(row.LastError))
	}
	if rec.Count(id) != 0 {
		t.Error("a dead message was published")
	}
}

// TestPurge: done and dead messages past the retention are purged; those
// not finished never, however old.
func TestPurge(t *testing.T) {
	db := outboxtest.NewDB(t)
	done := enqueueN(t, db, "done", 3, 1)
	dead := db.Enqueue(t, "dead", outbox.Message{Topic: "poison"})[0]
	waiting := db.Enqueue(t, "waiting", outbox.Message{Topic: "later"})[0]
	// Due in an hour: ready all along.
	if _, err := db.Pool.Exec(ctx, `UPDATE idempotency_outbox SET due_at = clock_timestamp() + interval '1 hour',
		enqueued_at = clock_timestamp() - interval '1 day' WHERE topic = 'later'`); err != nil {
		t.Fatal(err)
	}
	rec := outboxtest.NewRecorder()
	rec.FailWith(func(e outbox.Envelope) error {
		if e.Topic == "poison" {
			return errors.New("refused")
		}
		return nil
	})
	ev := start(t, db.Pool, rec, relay.WithMaxAttempts(1), relay.WithRetention(100*time.Millisecond), relay.WithPollInterval(50*time.Millisecond))
	ev.Await(t, 10*time.Second, "4 purged", func() bool {
		n := 0
		for _, e := range ev.Of(relay.EventPurged) {
			n += e.Count
		}
		return n == 4
	})
	for _, id := range append(done, dead) {
		if _, ok := db.Row(t, id); ok {
			t.Errorf("%s not purged", id)
		}
	}
	if row, ok := db.Row(t, waiting); !ok || row.Status != lifecycle.Ready {
		t.Errorf("the ready message: %+v, %v", row, ok)
	}
}

// TestLagReported: the lag is how long the earliest due message has been
// waiting (here behind an earlier message of its key that another relay
// holds), 0 once none is due.
func TestLagReported(t *testing.T) {
	db := outboxtest.NewDB(t)
	ids := db.Enqueue(t, "k", outbox.Message{Topic: "first"}, outbox.Message{Topic: "second"})
	if _, err := db.Pool.Exec(ctx, `UPDATE idempotency_outbox SET status = 'claimed', claim_token = 'held', claimed_by = 'other',
		claim_until = clock_timestamp() + interval '1 hour' WHERE seq = 1`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE idempotency_outbox SET due_at = clock_timestamp() - interval '90 seconds' WHERE seq = 2`); err != nil {
		t.Fatal(err)
	}
	rec := outboxtest.NewRecorder()
	ev := start(t, db.Pool, rec, relay.WithPollInterval(50*time.Millisecond))
	ev.Await(t, 10*time.Second, "a lag of 90s", func() bool {
		return slices.ContainsFunc(ev.Of(relay.EventLag), func(e relay.Event) bool { return e.Lag >= 90*time.Second && e.Lag < 100*time.Second })
	})
	if rec.Count(ids[1]) != 0 {
		t.Fatal("the second message was presented while the first was claimed")
	}
	// The other relay finishes the first message.
	if _, err := db.Pool.Exec(ctx, `UPDATE idempotency_outbox SET status = 'done', claim_token = NULL, claim_until = NULL, finished_at = clock_timestamp() WHERE seq = 1`); err != nil {
		t.Fatal(err)
	}
	if err := rec.AwaitIDs(10*time.Second, ids[1]); err != nil {
		t.Fatal(err)
	}
	ev.Await(t, 10*time.Second, "a lag of 0", func() bool {
		lags := ev.Of(relay.EventLag)
		return lags[len(lags)-1].Lag == 0
	})
}
