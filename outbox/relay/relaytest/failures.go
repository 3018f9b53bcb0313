package relaytest

import (
	"context"
	"errors"
	"fmt"
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

var failureTests = []test{
	{"BackoffThenDead", testFailingSinkBacksOffThenDead},
	{"SinkPanic", testSinkPanicIsAFailure},
	{"SinkRefusesPermanently", testSinkRefusesPermanently},
	{"SinkSuspends", testSinkSuspends},
	{"UnreadableRowSetApart", testUnreadableRowSetApart},
	{"ExpiredClaimAtTheCapIsDead", testExpiredClaimAtTheCapIsDead},
}

// testFailingSinkBacksOffThenDead: a message the sink fails waits for a
// retry with a growing backoff, and is dead at the cap with the last
// error; the messages of other keys go on meanwhile.
func testFailingSinkBacksOffThenDead(t *testing.T, tg Target) {
	rec := outboxtest.NewRecorder()
	rec.FailWith(func(e outbox.Envelope) error {
		if e.Topic == "poison" {
			return fmt.Errorf("broker refused attempt %d", e.Attempt)
		}
		return nil
	})
	poison := enqueue(t, tg, "bad", outbox.Message{Topic: "poison"})[0]
	good := enqueueN(t, tg, "good", 5, 1)
	ev := start(t, tg.NewRelay, rec, relay.WithMaxAttempts(4), relay.WithBackoff(20*time.Millisecond, 40*time.Millisecond))
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
	if r := mustRow(t, tg, poison); r.State != lifecycle.Dead || r.Attempts != 4 || r.lastError() != relay.CodePublishFailed+": broker refused attempt 4" {
		t.Errorf("dead row %v", r)
	}
	if n := rec.Failures(poison); n != 4 {
		t.Errorf("%d presentations of the poison message, want 4", n)
	}
	reliability.Report(t, reliability.Result{Scenario: "outbox: a sink that refuses a message", Store: tg.Engine,
		Operations: 9, Faults: 4, Note: "3 retries with backoff (20ms doubling to 40ms, jittered), dead at the 4th attempt with its error; the other keys' 5 messages delivered meanwhile"})
}

// testSinkPanicIsAFailure: a sink that panics costs an attempt, recorded
// as sink_panicked; the relay goes on.
func testSinkPanicIsAFailure(t *testing.T, tg Target) {
	var once sync.Once
	rec := outboxtest.NewRecorder()
	sink := outbox.SinkFunc(func(ctx context.Context, e outbox.Envelope) error {
		once.Do(func() { panic("sink bug") })
		return rec.Publish(ctx, e)
	})
	id := enqueue(t, tg, "k", outbox.Message{Topic: "t"})[0]
	ev := start(t, tg.NewRelay, sink)
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
	ev.Await(t, 5*time.Second, "published", func() bool { return len(ev.Of(relay.EventPublished)) == 1 })
	if row := mustRow(t, tg, id); row.State != lifecycle.Done || row.Attempts != 2 || !strings.HasPrefix(row.lastError(), relay.CodeSinkPanicked+": ") {
		t.Errorf("row %v, want done at attempt 2, the panic kept", row)
	}
}

// testSinkRefusesPermanently: a message the sink refuses with
// outbox.Permanent is dead after one attempt, with the refusal as its
// last error; the later message of its key and the other keys go on.
func testSinkRefusesPermanently(t *testing.T, tg Target) {
	rec := outboxtest.NewRecorder()
	rec.FailWith(func(e outbox.Envelope) error {
		if e.Topic == "unroutable" {
			return outbox.Permanent(errors.New("natsink: no stream for the subject"))
		}
		return nil
	})
	ids := enqueue(t, tg, "k", outbox.Message{Topic: "unroutable"}, outbox.Message{Topic: "good"})
	bad := ids[0]
	others := enqueueN(t, tg, "other", 3, 1)
	ev := start(t, tg.NewRelay, rec, relay.WithMaxAttempts(25))
	if err := rec.AwaitIDs(10*time.Second, append(others, ids[1])...); err != nil {
		t.Fatal(err)
	}
	ev.Await(t, 5*time.Second, "refused", func() bool { return len(ev.Of(relay.EventRefused)) == 1 })
	r := ev.Of(relay.EventRefused)[0]
	if r.ID != bad || r.Attempt != 1 || !errors.Is(r.Err, outbox.ErrPermanent) {
		t.Errorf("refused event %+v", r)
	}
	if row := mustRow(t, tg, bad); row.State != lifecycle.Dead || row.Attempts != 1 || row.lastError() != relay.CodeRefused+": natsink: no stream for the subject" {
		t.Errorf("row %v", row)
	}
	if n := rec.Failures(bad); n != 1 {
		t.Errorf("%d presentations of the refused message, want 1", n)
	}
	if n := len(ev.Of(relay.EventRetried)) + len(ev.Of(relay.EventDead)); n != 0 {
		t.Errorf("%d retries or deaths reported beside the refusal", n)
	}
}

// testSinkSuspends: a message the sink suspends (outbox.Suspend) is
// suspended with the sink's reason, no attempt counted, and holds the
// later message of its key back; resumed, both are published in order.
func testSinkSuspends(t *testing.T, tg Target) {
	rec := outboxtest.NewRecorder()
	var mu sync.Mutex
	budget := false
	rec.FailWith(func(e outbox.Envelope) error {
		mu.Lock()
		defer mu.Unlock()
		if e.Topic == "metered" && !budget {
			return outbox.Suspend("the daily budget is exhausted")
		}
		return nil
	})
	ids := enqueue(t, tg, "k", outbox.Message{Topic: "metered"}, outbox.Message{Topic: "after"})
	// The poll finds the resumed message where the engine has no
	// notifications.
	ev := start(t, tg.NewRelay, rec, relay.WithPollInterval(100*time.Millisecond))
	ev.Await(t, 10*time.Second, "suspended", func() bool { return len(ev.Of(relay.EventSuspended)) == 1 })
	s := ev.Of(relay.EventSuspended)[0]
	if s.ID != ids[0] || s.Reason != "the daily budget is exhausted" || !errors.Is(s.Err, outbox.ErrSuspend) {
		t.Errorf("suspended event %+v", s)
	}
	if r := mustRow(t, tg, ids[0]); r.State != lifecycle.Suspended || r.Attempts != 0 {
		t.Errorf("row %v, want suspended, no attempt counted", r)
	}
	if err := rec.AwaitIDs(300*time.Millisecond, ids[1]); err == nil {
		t.Fatal("the later message of a suspended one's key was published")
	}
	mu.Lock()
	budget = true
	mu.Unlock()
	resume(t, tg, lifecycle.Selector{All: true})
	if err := rec.AwaitIDs(10*time.Second, ids...); err != nil {
		t.Fatal(err)
	}
	d := rec.Deliveries()
	if d[0].ID != ids[0] || d[0].Attempt != 1 || d[1].ID != ids[1] {
		t.Errorf("deliveries %v, %v: want the resumed message first, at attempt 1", d[0].Envelope, d[1].Envelope)
	}
}

// resume resumes the messages sel selects, as an operator does, and
// wakes the relays where the engine can.
func resume(t *testing.T, tg Target, sel lifecycle.Selector) {
	t.Helper()
	if got, err := tg.Table.Resume(ctx, tg.DB, sel); err != nil || len(got) == 0 {
		t.Fatalf("resume: %+v, %v", got, err)
	}
	if err := tg.Table.Notify(ctx, tg.DB); err != nil {
		t.Fatal(err)
	}
}

// testUnreadableRowSetApart: one row of a batch that the relay cannot
// read (headers written by another producer that are not a JSON object of
// strings) is set apart alone, dead with the real decode error, after
// one attempt; the 9 healthy messages of its batch are published once
// each.
func testUnreadableRowSetApart(t *testing.T, tg Target) {
	ids := enqueueN(t, tg, "k", 10, 1)
	bad := ids[4]
	corrupt(t, tg, bad)
	rec := outboxtest.NewRecorder()
	ev := start(t, tg.NewRelay, rec, relay.WithClaimLease(time.Second))
	healthy := slices.Delete(slices.Clone(ids), 4, 5)
	if err := rec.AwaitIDs(10*time.Second, healthy...); err != nil {
		t.Fatalf("%v: %d of 9 healthy messages published", err, len(rec.Counts()))
	}
	ev.Await(t, 5*time.Second, "the bad row set apart", func() bool { return len(ev.Of(relay.EventUnreadable)) == 1 })
	rec.ExpectOnceEach(t, healthy)
	if c := ev.Of(relay.EventClaimed); len(c) == 0 || c[0].Count != 10 {
		t.Errorf("claims %+v, want the 10 messages in one batch", c)
	}
	u := ev.Of(relay.EventUnreadable)[0]
	if u.ID != bad || u.Attempt != 1 || u.Err == nil || !strings.Contains(u.Err.Error(), unreadableWhy) {
		t.Errorf("unreadable event %+v", u)
	}
	r := mustRow(t, tg, bad)
	if r.State != lifecycle.Dead || r.Attempts != 1 || !strings.HasPrefix(r.lastError(), relay.CodeUnreadable+": row ") ||
		!strings.Contains(r.lastError(), unreadableWhy) {
		t.Errorf("the bad row: %v", r)
	}
	ev.Await(t, 5*time.Second, "9 published", func() bool { return len(ev.Of(relay.EventPublished)) == 9 })
	if st := statuses(t, tg); st[lifecycle.Done] != 9 || st[lifecycle.Dead] != 1 || len(st) != 2 {
		t.Errorf("statuses %v, want 9 done and 1 dead", st)
	}
	if n := len(ev.Of(relay.EventError)) + len(ev.Of(relay.EventReclaimed)); n != 0 {
		t.Errorf("%d errors and claims taken back, want none", n)
	}
	reliability.Report(t, reliability.Result{Scenario: "outbox: an unreadable row in a batch", Store: tg.Engine,
		Operations: 10, Faults: 1, Note: "headers {\"retries\": 3} in one row of a batch of 10: that row dead after 1 attempt with the decode error; the 9 others published once each, none taken back"})
}

// unreadableWhy is the decode error of the headers corrupt writes.
const unreadableWhy = "column headers is not a JSON object of strings: json: cannot unmarshal number"

// corrupt writes headers that are not a JSON object of strings into the
// row of the message id.
func corrupt(t *testing.T, tg Target, id string) {
	t.Helper()
	if err := tg.WriteHeaders(ctx, id, `{"retries": 3}`); err != nil {
		t.Fatalf("corrupt the headers of %s: %v", id, err)
	}
}

// testExpiredClaimAtTheCapIsDead: a claim that ran out on the last
// allowed attempt makes the message dead, with claim_expired, unpublished.
func testExpiredClaimAtTheCapIsDead(t *testing.T, tg Target) {
	id := enqueue(t, tg, "k", outbox.Message{Topic: "t"})[0]
	// A first attempt failed; a relay that died held the claim of the
	// second, which ran out.
	first, err := tg.Table.Claim(ctx, tg.DB, "first", "dead-relay", time.Hour, 10)
	if err != nil || len(first) != 1 {
		t.Fatalf("the first claim: %+v, %v", first, err)
	}
	if m, err := tg.Table.Retry(ctx, tg.DB, "first", first[0].RowID, 100, 0, relay.CodePublishFailed+": broker down"); err != nil || m.State != lifecycle.RetryWait {
		t.Fatalf("the first attempt's retry: %+v, %v", m, err)
	}
	if second, err := tg.Table.Claim(ctx, tg.DB, "gone", "dead-relay", time.Millisecond, 10); err != nil || len(second) != 1 || second[0].Attempts != 1 {
		t.Fatalf("the second claim: %+v, %v", second, err)
	}
	rec := outboxtest.NewRecorder()
	ev := start(t, tg.NewRelay, rec, relay.WithMaxAttempts(2))
	ev.Await(t, 10*time.Second, "dead", func() bool { return len(ev.Of(relay.EventDead)) == 1 })
	if d := ev.Of(relay.EventDead)[0]; d.ID != id || !d.Reclaimed || d.Attempt != 2 {
		t.Errorf("dead event %+v", d)
	}
	if r := mustRow(t, tg, id); r.State != lifecycle.Dead || r.Attempts != 2 || !strings.HasPrefix(r.lastError(), relay.CodeClaimExpired+": the claim of dead-relay") {
		t.Errorf("row %v", r)
	}
	if rec.Count(id) != 0 {
		t.Error("a dead message was published")
	}
}
