package relay_test

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
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/outbox/relay"
)

// batchRecorder is an outbox.BatchSink over a Recorder: each call
// publishes its envelopes to the Recorder in turn and keeps their IDs,
// after waiting for hold, when set, to return a channel that is closed (or
// nil). Its Publish fails the test: a relay gives a BatchSink whole
// batches.
type batchRecorder struct {
	t   testing.TB
	rec *outboxtest.Recorder

	mu    sync.Mutex
	calls [][]string
	ctxs  []context.Context
	hold  func(call int) <-chan struct{}
}

func newBatchRecorder(t testing.TB) *batchRecorder {
	return &batchRecorder{t: t, rec: outboxtest.NewRecorder()}
}

func (b *batchRecorder) Publish(ctx context.Context, e outbox.Envelope) error {
	b.t.Errorf("Publish(%s) called on a BatchSink", e.ID)
	return b.rec.Publish(ctx, e)
}

func (b *batchRecorder) PublishBatch(ctx context.Context, es []outbox.Envelope) []error {
	b.mu.Lock()
	ids := make([]string, len(es))
	for i, e := range es {
		ids[i] = e.ID
	}
	b.calls = append(b.calls, ids)
	b.ctxs = append(b.ctxs, ctx)
	call, hold := len(b.calls)-1, b.hold
	b.mu.Unlock()
	if hold != nil {
		if ch := hold(call); ch != nil {
			<-ch
		}
	}
	errs := make([]error, len(es))
	for i, e := range es {
		errs[i] = b.rec.Publish(ctx, e)
	}
	return errs
}

// call returns the IDs of call i and its context, and false before it.
func (b *batchRecorder) call(i int) ([]string, context.Context, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if i >= len(b.calls) {
		return nil, nil, false
	}
	return b.calls[i], b.ctxs[i], true
}

// TestBatchSinkMixedOutcomes: a BatchSink is given a claimed batch in one
// call, and each envelope's outcome is marked on its own: those it
// confirms done at their first attempt, the one it fails waiting for a
// retry (and done at its second), the one it refuses permanently dead at
// once, the one it suspends suspended without an attempt counted. A row
// of the batch that cannot be read is set apart before the call, dead
// with its decode error.
func TestBatchSinkMixedOutcomes(t *testing.T) {
	db := outboxtest.NewDB(t)
	sink := newBatchRecorder(t)
	var mu sync.Mutex
	failed := map[string]bool{}
	sink.rec.FailWith(func(e outbox.Envelope) error {
		switch e.Topic {
		case "flaky":
			mu.Lock()
			defer mu.Unlock()
			if !failed[e.ID] {
				failed[e.ID] = true
				return errors.New("broker hiccup")
			}
		case "bad":
			return outbox.Permanent(errors.New("invalid subject"))
		case "wait":
			return outbox.Suspend("quota exhausted")
		}
		return nil
	})
	var ok []string
	for i := range 5 {
		ok = append(ok, db.Enqueue(t, fmt.Sprintf("ok-%d", i), outbox.Message{Topic: "ok"})...)
	}
	flaky := db.Enqueue(t, "flaky", outbox.Message{Topic: "flaky"})[0]
	bad := db.Enqueue(t, "bad", outbox.Message{Topic: "bad"})[0]
	wait := db.Enqueue(t, "wait", outbox.Message{Topic: "wait"})[0]
	unreadable := db.Enqueue(t, "unreadable", outbox.Message{Topic: "ok"})[0]
	key, seq, _ := outbox.ParseID(unreadable)
	if _, err := db.Pool.Exec(ctx, `UPDATE idempotency_outbox SET headers = '{"retries": 3}' WHERE storage_key = $1 AND seq = $2`, key, seq); err != nil {
		t.Fatal(err)
	}

	ev := start(t, db.Pool, sink)
	if err := sink.rec.AwaitIDs(10*time.Second, append(ok, flaky)...); err != nil {
		t.Fatal(err)
	}
	ev.Await(t, 5*time.Second, "6 published, 1 refused, 1 suspended, 1 unreadable", func() bool {
		return len(ev.Of(relay.EventPublished)) == 6 && len(ev.Of(relay.EventRefused)) == 1 && len(ev.Of(relay.EventSuspended)) == 1 &&
			len(ev.Of(relay.EventUnreadable)) == 1
	})
	if c := ev.Of(relay.EventClaimed); c[0].Count != 9 {
		t.Errorf("the first claim took %d messages, want the 9", c[0].Count)
	}
	first, _, _ := sink.call(0)
	if want := append(slices.Clone(ok), flaky, bad, wait); !slices.Equal(slices.Sorted(slices.Values(first)), slices.Sorted(slices.Values(want))) {
		t.Errorf("the first call presented %v, want the whole batch %v", first, want)
	}
	for _, id := range ok {
		if row, _ := db.Row(t, id); row.Status != lifecycle.Done || row.Attempts != 1 {
			t.Errorf("confirmed %s: %+v, want done at attempt 1", id, row)
		}
	}
	if r := ev.Of(relay.EventRetried); len(r) != 1 || r[0].ID != flaky || r[0].Attempt != 1 {
		t.Errorf("retried events %+v, want the flaky message's first attempt", r)
	}
	if row, _ := db.Row(t, flaky); row.Status != lifecycle.Done || row.Attempts != 2 {
		t.Errorf("failed once %s: %+v, want done at attempt 2", flaky, row)
	}
	if row, _ := db.Row(t, bad); row.Status != lifecycle.Dead || row.Attempts != 1 || deref(row.LastError) != relay.CodeRefused+": invalid subject" {
		t.Errorf("refused %s: %+v, last error %q", bad, row, deref(row.LastError))
	}
	if row, _ := db.Row(t, wait); row.Status != lifecycle.Suspended || row.Attempts != 0 {
		t.Errorf("suspended %s: %+v, want no attempt counted", wait, row)
	}
	if row, _ := db.Row(t, unreadable); row.Status != lifecycle.Dead || row.Attempts != 1 ||
		!strings.Contains(deref(row.LastError), relay.CodeUnreadable+": row ") || !strings.Contains(deref(row.LastError), "column headers") {
		t.Errorf("unreadable %s: %+v, last error %q", unreadable, row, deref(row.LastError))
	}
	for _, p := range ev.Of(relay.EventPublished) {
		if p.Age <= 0 || p.Duration <= 0 {
			t.Errorf("published event %+v", p)
		}
	}
	sink.rec.ExpectOnceEach(t, append(ok, flaky))
	reliability.Report(t, reliability.Result{Scenario: "outbox: a batch sink confirms some envelopes of a call and fails others", Store: "postgres",
		Operations: 9, Faults: 4, Note: "a claim of 9, one row unreadable: set apart, dead with its decode error; one PublishBatch of the other 8: 5 confirmed done at attempt 1; one failed, retried and done at attempt 2; one refused permanently, dead at once; one suspended, no attempt counted"})
}

// TestNextBatchSkipsKeysInFlight: while the sink holds a batch, the relay
// claims the next one, which takes no message of an ordering key whose
// message is in flight, however due: those wait for the batch's done
// marks, and every key's messages are published in order.
func TestNextBatchSkipsKeysInFlight(t *testing.T) {
	db := outboxtest.NewDB(t)
	// In id order: the first message of keys a, b and c, their second
	// ones, then three keys of one message.
	var firsts, seconds, others []string
	for _, k := range []string{"a", "b", "c"} {
		firsts = append(firsts, db.Enqueue(t, k+"1", outbox.Message{Topic: "t", OrderingKey: k})...)
	}
	for _, k := range []string{"a", "b", "c"} {
		seconds = append(seconds, db.Enqueue(t, k+"2", outbox.Message{Topic: "t", OrderingKey: k})...)
	}
	for _, k := range []string{"d", "e", "f"} {
		others = append(others, db.Enqueue(t, k+"1", outbox.Message{Topic: "t", OrderingKey: k})...)
	}
	sink := newBatchRecorder(t)
	release := make(chan struct{})
	sink.hold = func(call int) <-chan struct{} {
		if call == 0 {
			return release
		}
		return nil
	}
	ev := start(t, db.Pool, sink, relay.WithBatchSize(3))
	// The first batch is with the sink; the next one is claimed meanwhile.
	ev.Await(t, 10*time.Second, "two claims", func() bool { return len(ev.Of(relay.EventClaimed)) >= 2 })
	if first, _, _ := sink.call(0); !slices.Equal(first, firsts) {
		t.Fatalf("the first batch presented %v, want %v", first, firsts)
	}
	for _, id := range append(slices.Clone(firsts), others...) {
		if row, _ := db.Row(t, id); row.Status != lifecycle.Claimed {
			t.Errorf("%s: %s while the first batch is in flight, want claimed", id, row.Status)
		}
	}
	for _, id := range seconds {
		if row, _ := db.Row(t, id); row.Status != lifecycle.Ready {
			t.Errorf("%s, whose key's message is in flight: %s, want ready", id, row.Status)
		}
	}
	if n := len(ev.Of(relay.EventClaimed)); n != 2 {
		t.Errorf("%d claims while the sink holds the first batch, want 2 (one claimed ahead)", n)
	}
	close(release)
	all := append(append(slices.Clone(firsts), seconds...), others...)
	if err := sink.rec.AwaitIDs(10*time.Second, all...); err != nil {
		t.Fatal(err)
	}
	sink.rec.ExpectOnceEach(t, all)
	position := map[string]int{}
	for i, d := range sink.rec.Deliveries() {
		position[d.ID] = i
	}
	for i := range firsts {
		if position[firsts[i]] > position[seconds[i]] {
			t.Errorf("key %d: %s published before %s", i, seconds[i], firsts[i])
		}
	}
	if second, _, _ := sink.call(1); !slices.Equal(second, others) {
		t.Errorf("the batch claimed while the first was in flight: %v, want %v", second, others)
	}
	db.AwaitAllDone(t, 5*time.Second)
}

// TestBatchKeepsItsClaim: a BatchSink that works for several leases keeps
// the claim on its batch (extended every third of a lease) while a second
// relay polls the table: each message is presented once and done at its
// first attempt.
func TestBatchKeepsItsClaim(t *testing.T) {
	db := outboxtest.NewDB(t)
	const lease = 300 * time.Millisecond
	ids := enqueueN(t, db, "slow", 4, 1)
	sink := newBatchRecorder(t)
	sink.hold = func(call int) <-chan struct{} {
		ch := make(chan struct{})
		time.AfterFunc(4*lease, func() { close(ch) })
		return ch
	}
	evA := start(t, db.Pool, sink, relay.WithName("a"), relay.WithClaimLease(lease))
	if _, _, ok := awaitCall(t, sink, 0); !ok {
		t.Fatal("no batch presented")
	}
	other := outboxtest.NewRecorder()
	evB := start(t, newPool(t, db.URL), other, relay.WithName("b"), relay.WithClaimLease(lease), relay.WithPollInterval(20*time.Millisecond))
	evA.Await(t, 10*time.Second, "published", func() bool { return len(evA.Of(relay.EventPublished)) == len(ids) })
	if n := len(evA.Of(relay.EventExtended)); n < 3 {
		t.Errorf("%d extends over 4 leases, want at least 3", n)
	}
	if l := evA.Of(relay.EventClaimLost); len(l) != 0 {
		t.Errorf("claim lost: %+v", l)
	}
	if n := len(evB.Of(relay.EventReclaimed)) + len(other.Counts()); n != 0 {
		t.Errorf("the other relay took messages back or presented them (%d)", n)
	}
	sink.rec.ExpectOnceEach(t, ids)
	for _, id := range ids {
		if row, _ := db.Row(t, id); row.Status != lifecycle.Done || row.Attempts != 1 {
			t.Errorf("%s: %+v, want done at attempt 1", id, row)
		}
	}
}

// awaitCall waits for the sink's call i, for at most 10s.
func awaitCall(t testing.TB, sink *batchRecorder, i int) ([]string, context.Context, bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if ids, ctx, ok := sink.call(i); ok {
			return ids, ctx, true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil, nil, false
}

// TestBatchLosesItsMessagesOneByOne: a message of a batch in flight that an
// operator cancels is lost alone: the call's context goes on for the
// others, and the canceled message's done mark is refused though the sink
// confirmed it. Once the other messages are suspended too, the call's
// context is cancelled, with a cause wrapping ErrClaimLost, and their
// marks are refused.
func TestBatchLosesItsMessagesOneByOne(t *testing.T) {
	db := outboxtest.NewDB(t)
	const lease = 300 * time.Millisecond
	ids := enqueueN(t, db, "k", 3, 1)
	sink := newBatchRecorder(t)
	release := make(chan struct{})
	sink.hold = func(int) <-chan struct{} { return release }
	ev := start(t, db.Pool, sink, relay.WithClaimLease(lease))
	presented, callCtx, ok := awaitCall(t, sink, 0)
	if !ok || len(presented) != 3 {
		t.Fatalf("presented %v, want the 3 messages in one call", presented)
	}
	tb := table(t)
	if _, err := tb.Cancel(ctx, db.Pool, ids[:1], "refunded"); err != nil {
		t.Fatal(err)
	}
	ev.Await(t, 10*time.Second, "the canceled message lost", func() bool { return len(ev.Of(relay.EventClaimLost)) == 1 })
	if l := ev.Of(relay.EventClaimLost)[0]; l.ID != ids[0] || l.State != lifecycle.Canceled {
		t.Errorf("claim lost %+v, want %s canceled", l, ids[0])
	}
	// Two more extends: the call's context stays, for the two others.
	extends := len(ev.Of(relay.EventExtended))
	ev.Await(t, 10*time.Second, "two more extends", func() bool { return len(ev.Of(relay.EventExtended)) >= extends+2 })
	if err := callCtx.Err(); err != nil {
		t.Fatalf("the call's context ended (%v) when one of its three messages was canceled", context.Cause(callCtx))
	}
	if _, err := tb.Suspend(ctx, db.Pool, lifecycle.Selector{IDs: ids[1:]}, "investigating"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-callCtx.Done():
		if cause := context.Cause(callCtx); !errors.Is(cause, outbox.ErrClaimLost) {
			t.Errorf("the call's context ended with %v, want a cause wrapping ErrClaimLost", cause)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call's context was not cancelled once all its messages were lost")
	}
	close(release) // the sink confirms them all
	ev.Await(t, 10*time.Second, "the refused marks", func() bool {
		return len(ev.Of(relay.EventCanceled)) == 1 && len(ev.Of(relay.EventFenced)) == 2
	})
	if c := ev.Of(relay.EventCanceled)[0]; c.ID != ids[0] || !c.Published {
		t.Errorf("canceled event %+v", c)
	}
	for _, f := range ev.Of(relay.EventFenced) {
		if f.State != lifecycle.Suspended || !f.Published {
			t.Errorf("fenced event %+v, want a published message found suspended", f)
		}
	}
	if p := ev.Of(relay.EventPublished); len(p) != 0 {
		t.Errorf("published events %+v for messages whose claim was lost", p)
	}
	st := db.Statuses(t)
	if st[lifecycle.Canceled] != 1 || st[lifecycle.Suspended] != 2 || len(st) != 2 {
		t.Errorf("statuses %v, want 1 canceled and 2 suspended", st)
	}
}

// TestBatchContextEndsBeforeTakeover: a relay whose sink holds a batch
// (ignoring its context) loses its database: its extends fail, and it
// cancels the call's context, with a cause wrapping ErrClaimLost, before
// the claim could run out on the server and another relay take the batch
// back.
func TestBatchContextEndsBeforeTakeover(t *testing.T) {
	db := outboxtest.NewDB(t)
	const lease = 300 * time.Millisecond
	ids := enqueueN(t, db, "k", 3, 1)
	sink := newBatchRecorder(t)
	release := make(chan struct{})
	sink.hold = func(int) <-chan struct{} { return release }
	defer close(release)
	pool, proxy := pgtest.ProxiedPool(t, db.URL)
	ev := start(t, pool, sink, relay.WithClaimLease(lease))
	presented, callCtx, ok := awaitCall(t, sink, 0)
	if !ok || len(presented) != len(ids) {
		t.Fatalf("presented %v, want the 3 messages in one call", presented)
	}
	proxy.Stall() // the relay's extends get no answer
	select {
	case <-callCtx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the call's context was not cancelled while the relay could not extend its claim")
	}
	lostBy := time.Now()
	if cause := context.Cause(callCtx); !errors.Is(cause, outbox.ErrClaimLost) {
		t.Errorf("the call's context ended with %v, want a cause wrapping ErrClaimLost", cause)
	}
	// The server's clock and this one are the same machine's.
	var until time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT min(claim_until) FROM idempotency_outbox WHERE status = 'claimed'`).Scan(&until); err != nil {
		t.Fatal(err)
	}
	if !lostBy.Before(until) {
		t.Errorf("the call's context ended at %v, not before the claim ran out at %v", lostBy, until)
	}
	ev.Await(t, 5*time.Second, "3 claims lost", func() bool { return len(ev.Of(relay.EventClaimLost)) == 3 })
	proxy.Restore()
}
