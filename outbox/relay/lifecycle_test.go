package relay_test

import (
	"context"
	"errors"
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

// table is the default outbox table's edges.
func table(t testing.TB) *lifecycle.Table {
	t.Helper()
	tb, err := outbox.Table("idempotency_outbox")
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

// lastError returns the last_error of the message id, "" for none.
func lastError(t testing.TB, db *outboxtest.DB, id string) string {
	t.Helper()
	row, ok := db.Row(t, id)
	if !ok {
		t.Fatalf("no row %s", id)
	}
	return deref(row.LastError)
}

// TestUnreadableRowSetApart: one row of a batch that the relay cannot read
// (headers written by another producer that are not a JSON object of
// strings) is set apart alone, dead with the real decode error, after one
// attempt; the 9 healthy messages of its batch are published once each.
func TestUnreadableRowSetApart(t *testing.T) {
	db := outboxtest.NewDB(t)
	ids := enqueueN(t, db, "k", 10, 1)
	bad := ids[4]
	key, seq, _ := outbox.ParseID(bad)
	if _, err := db.Pool.Exec(ctx, `UPDATE idempotency_outbox SET headers = '{"retries": 3}' WHERE storage_key = $1 AND seq = $2`, key, seq); err != nil {
		t.Fatal(err)
	}
	rec := outboxtest.NewRecorder()
	ev := start(t, db.Pool, rec, relay.WithClaimLease(time.Second))
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
	const why = "column headers is not a JSON object of strings: json: cannot unmarshal number"
	if u.ID != bad || u.Attempt != 1 || u.Err == nil || !strings.Contains(u.Err.Error(), why) {
		t.Errorf("unreadable event %+v", u)
	}
	row, _ := db.Row(t, bad)
	if row.Status != lifecycle.Dead || row.Attempts != 1 || !strings.HasPrefix(deref(row.LastError), relay.CodeUnreadable+": row ") ||
		!strings.Contains(deref(row.LastError), why) {
		t.Errorf("the bad row: %+v, last error %q", row, deref(row.LastError))
	}
	ev.Await(t, 5*time.Second, "9 published", func() bool { return len(ev.Of(relay.EventPublished)) == 9 })
	if st := db.Statuses(t); st[lifecycle.Done] != 9 || st[lifecycle.Dead] != 1 || len(st) != 2 {
		t.Errorf("statuses %v, want 9 done and 1 dead", st)
	}
	if n := len(ev.Of(relay.EventError)) + len(ev.Of(relay.EventReclaimed)); n != 0 {
		t.Errorf("%d errors and claims taken back, want none", n)
	}
	reliability.Report(t, reliability.Result{Scenario: "outbox: an unreadable row in a batch", Store: "postgres",
		Operations: 10, Faults: 1, Note: "headers {\"retries\": 3} in one row of a batch of 10: that row dead after 1 attempt with the decode error; the 9 others published once each, none taken back"})
}

// TestScheduledMessagePublishedAtItsTime: a message enqueued with a
// NotBefore is not presented before it, and a relay that polls once a
// minute presents it as it falls due.
func TestScheduledMessagePublishedAtItsTime(t *testing.T) {
	db := outboxtest.NewDB(t)
	rec := outboxtest.NewRecorder()
	start(t, db.Pool, rec, relay.WithPollInterval(time.Minute))
	notBefore := time.Now().Add(400 * time.Millisecond)
	ids := db.Enqueue(t, "later", outbox.Message{Topic: "reminders", NotBefore: notBefore}, outbox.Message{Topic: "after"})
	if row, _ := db.Row(t, ids[0]); row.Status != lifecycle.Scheduled {
		t.Fatalf("enqueued with a NotBefore: %+v, want scheduled", row)
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

// TestLongPublishKeepsItsClaim: a sink that works for several leases keeps
// the claim (extended every third of a lease) while a second relay polls
// the table: the message is presented once, confirmed once, and done at
// its first attempt.
func TestLongPublishKeepsItsClaim(t *testing.T) {
	db := outboxtest.NewDB(t)
	const lease = 300 * time.Millisecond
	id := db.Enqueue(t, "slow", outbox.Message{Topic: "t"})[0]
	rec := outboxtest.NewRecorder()
	var presented sync.Once
	started := make(chan struct{})
	slow := outbox.SinkFunc(func(ctx context.Context, e outbox.Envelope) error {
		presented.Do(func() { close(started) })
		select {
		case <-time.After(4 * lease):
			return rec.Publish(ctx, e)
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	})
	evA := start(t, db.Pool, slow, relay.WithName("a"), relay.WithClaimLease(lease))
	<-started
	other := outboxtest.NewRecorder()
	evB := start(t, newPool(t, db.URL), other, relay.WithName("b"), relay.WithClaimLease(lease), relay.WithPollInterval(20*time.Millisecond))
	evA.Await(t, 10*time.Second, "published", func() bool { return len(evA.Of(relay.EventPublished)) == 1 })
	if p := evA.Of(relay.EventPublished)[0]; p.Attempt != 1 || p.Duration < 4*lease {
		t.Errorf("published %+v, want attempt 1 after 4 leases", p)
	}
	if n := len(evA.Of(relay.EventExtended)); n < 3 {
		t.Errorf("%d extends over 4 leases, want at least 3", n)
	}
	if l := evA.Of(relay.EventClaimLost); len(l) != 0 {
		t.Errorf("claim lost: %+v", l)
	}
	if n := len(evB.Of(relay.EventReclaimed)) + other.Count(id); n != 0 {
		t.Errorf("the other relay took the message back or presented it (%d)", n)
	}
	rec.ExpectOnceEach(t, []string{id})
	if row, _ := db.Row(t, id); row.Status != lifecycle.Done || row.Attempts != 1 {
		t.Errorf("row %+v, want done at attempt 1", row)
	}
	reliability.Report(t, reliability.Result{Scenario: "outbox: a publish longer than the claim lease", Store: "postgres",
		Operations: 1, Note: "a sink working 4 leases of 300ms kept its claim (extended every 100ms) beside another relay polling every 20ms: presented once, done at attempt 1"})
}

// TestCanceledWhilePresented: a message canceled while its sink works has
// the sink's context cancelled, with a cause wrapping ErrClaimLost, at the
// relay's next extend; its done mark is refused, though the sink
// confirmed it, and it stays canceled.
func TestCanceledWhilePresented(t *testing.T) {
	db := outboxtest.NewDB(t)
	const lease = 600 * time.Millisecond
	ids := db.Enqueue(t, "k", outbox.Message{Topic: "t"}, outbox.Message{Topic: "next"})
	started := make(chan struct{}, 2)
	cause := make(chan error, 1)
	var once sync.Once
	rec := outboxtest.NewRecorder()
	sink := outbox.SinkFunc(func(ctx context.Context, e outbox.Envelope) error {
		if e.ID != ids[0] {
			return rec.Publish(ctx, e)
		}
		once.Do(func() { started <- struct{}{} })
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return nil // the broker confirmed it anyway
	})
	ev := start(t, db.Pool, sink, relay.WithClaimLease(lease))
	<-started
	canceled, err := table(t).Cancel(ctx, db.Pool, ids[:1], "refunded")
	if err != nil || len(canceled) != 1 {
		t.Fatalf("cancel: %+v, %v", canceled, err)
	}
	at := time.Now()
	select {
	case err := <-cause:
		if !errors.Is(err, outbox.ErrClaimLost) {
			t.Errorf("the sink's context ended with %v, want a cause wrapping ErrClaimLost", err)
		}
		if took := time.Since(at); took > lease {
			t.Errorf("the sink's context was cancelled %v after the cancel, over a lease", took)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the sink's context was not cancelled")
	}
	ev.Await(t, 5*time.Second, "canceled", func() bool { return len(ev.Of(relay.EventCanceled)) == 1 })
	if c := ev.Of(relay.EventCanceled)[0]; c.ID != ids[0] || !c.Published {
		t.Errorf("canceled event %+v", c)
	}
	if l := ev.Of(relay.EventClaimLost); len(l) != 1 || l[0].State != lifecycle.Canceled || !errors.Is(l[0].Err, outbox.ErrClaimLost) {
		t.Errorf("claim lost events %+v", l)
	}
	if p := ev.Of(relay.EventPublished); len(p) != 0 && p[0].ID == ids[0] {
		t.Error("the canceled message was reported published")
	}
	row, _ := db.Row(t, ids[0])
	if row.Status != lifecycle.Canceled || row.Attempts != 0 || deref(row.LastError) != "canceled: refunded" {
		t.Errorf("row %+v, last error %q", row, deref(row.LastError))
	}
	// The next message of the key is not held back by a canceled one.
	if err := rec.AwaitIDs(10*time.Second, ids[1]); err != nil {
		t.Fatal(err)
	}
}

// TestSuspendedWhilePresented: an operator's suspension of a message the
// sink works on cancels the sink's context at the next extend and refuses
// the relay's mark; once resumed, the message is presented again without
// an attempt counted for the suspension.
func TestSuspendedWhilePresented(t *testing.T) {
	db := outboxtest.NewDB(t)
	id := db.Enqueue(t, "k", outbox.Message{Topic: "t"})[0]
	var first sync.Once
	started := make(chan struct{})
	rec := outboxtest.NewRecorder()
	sink := outbox.SinkFunc(func(ctx context.Context, e outbox.Envelope) error {
		isFirst := false
		first.Do(func() { isFirst = true })
		if !isFirst {
			return rec.Publish(ctx, e)
		}
		close(started)
		<-ctx.Done()
		return context.Cause(ctx)
	})
	ev := start(t, db.Pool, sink, relay.WithClaimLease(300*time.Millisecond))
	<-started
	tb := table(t)
	if got, err := tb.Suspend(ctx, db.Pool, lifecycle.Selector{IDs: []string{id}}, "investigating"); err != nil || len(got) != 1 {
		t.Fatalf("suspend: %+v, %v", got, err)
	}
	ev.Await(t, 10*time.Second, "fenced", func() bool { return len(ev.Of(relay.EventFenced)) == 1 })
	if f := ev.Of(relay.EventFenced)[0]; f.State != lifecycle.Suspended || f.Published {
		t.Errorf("fenced event %+v, want the suspended state", f)
	}
	if row, _ := db.Row(t, id); row.Status != lifecycle.Suspended || row.Attempts != 0 {
		t.Fatalf("row %+v, want suspended, no attempt counted", row)
	}
	if _, err := tb.Resume(ctx, db.Pool, lifecycle.Selector{IDs: []string{id}}); err != nil {
		t.Fatal(err)
	}
	if err := tb.Notify(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	if err := rec.AwaitIDs(10*time.Second, id); err != nil {
		t.Fatal(err)
	}
	if d := rec.Deliveries(); d[0].Attempt != 1 {
		t.Errorf("presented again at attempt %d, want 1: a suspension counts none", d[0].Attempt)
	}
}

// TestSinkRefusesPermanently: a message the sink refuses with
// outbox.Permanent is dead after one attempt, with the refusal as its last
// error; the later message of its key and the other keys go on.
func TestSinkRefusesPermanently(t *testing.T) {
	db := outboxtest.NewDB(t)
	rec := outboxtest.NewRecorder()
	rec.FailWith(func(e outbox.Envelope) error {
		if e.Topic == "bad topic" {
			return outbox.Permanent(errors.New("natsink: invalid subject"))
		}
		return nil
	})
	ids := db.Enqueue(t, "k", outbox.Message{Topic: "good"}, outbox.Message{Topic: "good"})
	bad := ids[0]
	// A topic Enqueue refuses, written by another producer.
	key, seq, _ := outbox.ParseID(bad)
	if _, err := db.Pool.Exec(ctx, `UPDATE idempotency_outbox SET topic = 'bad topic' WHERE storage_key = $1 AND seq = $2`, key, seq); err != nil {
		t.Fatal(err)
	}
	others := enqueueN(t, db, "other", 3, 1)
	ev := start(t, db.Pool, rec, relay.WithMaxAttempts(25))
	if err := rec.AwaitIDs(10*time.Second, append(others, ids[1])...); err != nil {
		t.Fatal(err)
	}
	ev.Await(t, 5*time.Second, "refused", func() bool { return len(ev.Of(relay.EventRefused)) == 1 })
	r := ev.Of(relay.EventRefused)[0]
	if r.ID != bad || r.Attempt != 1 || !errors.Is(r.Err, outbox.ErrPermanent) {
		t.Errorf("refused event %+v", r)
	}
	row, _ := db.Row(t, bad)
	if row.Status != lifecycle.Dead || row.Attempts != 1 || deref(row.LastError) != relay.CodeRefused+": natsink: invalid subject" {
		t.Errorf("row %+v, last error %q", row, deref(row.LastError))
	}
	if n := rec.Failures(bad); n != 1 {
		t.Errorf("%d presentations of the refused message, want 1", n)
	}
	if n := len(ev.Of(relay.EventRetried)) + len(ev.Of(relay.EventDead)); n != 0 {
		t.Errorf("%d retries or deaths reported beside the refusal", n)
	}
}

// TestSinkSuspends: a message the sink suspends (outbox.Suspend) is
// suspended with the sink's reason, no attempt counted, and holds the
// later message of its key back; resumed, both are published in order.
func TestSinkSuspends(t *testing.T) {
	db := outboxtest.NewDB(t)
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
	ids := db.Enqueue(t, "k", outbox.Message{Topic: "metered"}, outbox.Message{Topic: "after"})
	ev := start(t, db.Pool, rec)
	ev.Await(t, 10*time.Second, "suspended", func() bool { return len(ev.Of(relay.EventSuspended)) == 1 })
	s := ev.Of(relay.EventSuspended)[0]
	if s.ID != ids[0] || s.Reason != "the daily budget is exhausted" || !errors.Is(s.Err, outbox.ErrSuspend) {
		t.Errorf("suspended event %+v", s)
	}
	if row, _ := db.Row(t, ids[0]); row.Status != lifecycle.Suspended || row.Attempts != 0 {
		t.Errorf("row %+v, want suspended, no attempt counted", row)
	}
	if err := rec.AwaitIDs(300*time.Millisecond, ids[1]); err == nil {
		t.Fatal("the later message of a suspended one's key was published")
	}
	mu.Lock()
	budget = true
	mu.Unlock()
	tb := table(t)
	if _, err := tb.Resume(ctx, db.Pool, lifecycle.Selector{All: true}); err != nil {
		t.Fatal(err)
	}
	if err := tb.Notify(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	if err := rec.AwaitIDs(10*time.Second, ids...); err != nil {
		t.Fatal(err)
	}
	d := rec.Deliveries()
	if d[0].ID != ids[0] || d[0].Attempt != 1 || d[1].ID != ids[1] {
		t.Errorf("deliveries %v, %v: want the resumed message first, at attempt 1", d[0].Envelope, d[1].Envelope)
	}
}

// TestReleasedWhenStopping: when Run's context ends mid-batch, the publish
// in flight runs to its end and is marked, and the messages whose turn had
// not come are handed back, ready, no attempt counted.
func TestReleasedWhenStopping(t *testing.T) {
	db := outboxtest.NewDB(t)
	ids := enqueueN(t, db, "k", 3, 1)
	rec := outboxtest.NewRecorder()
	started := make(chan struct{})
	proceed := make(chan struct{})
	var once sync.Once
	sink := outbox.SinkFunc(func(ctx context.Context, e outbox.Envelope) error {
		once.Do(func() {
			close(started)
			<-proceed
		})
		return rec.Publish(ctx, e)
	})
	ev := newEvents()
	r := relay.New(db.Pool, sink, relay.WithObserver(ev.Observe))
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	<-started
	stop()
	close(proceed)
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
	if p, rel := ev.Of(relay.EventPublished), ev.Of(relay.EventReleased); len(p) != 1 || len(rel) != 1 || rel[0].Count != 2 {
		t.Fatalf("published %d, released %+v; want 1 and a release of 2", len(p), rel)
	}
	if st := db.Statuses(t); st[lifecycle.Done] != 1 || st[lifecycle.Ready] != 2 {
		t.Errorf("after the stop: %v", st)
	}
	for _, id := range ids {
		if row, _ := db.Row(t, id); row.Status == lifecycle.Ready && row.Attempts != 0 {
			t.Errorf("%s handed back with %d attempts", id, row.Attempts)
		}
	}
}

// TestEventKindsNamed: every kind has a name of its own.
func TestEventKindsNamed(t *testing.T) {
	seen := map[string]bool{}
	for _, k := range relay.EventKinds() {
		name := k.String()
		if name == "unknown" || seen[name] {
			t.Errorf("kind %d: name %q", k, name)
		}
		seen[name] = true
	}
	if len(seen) != 16 || relay.EventKind(0).String() != "unknown" || relay.EventKind(200).String() != "unknown" {
		t.Errorf("%d kinds", len(seen))
	}
}
