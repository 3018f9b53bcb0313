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

var batchTests = []test{
	{"MixedOutcomes", testBatchSinkMixedOutcomes},
	{"NextBatchSkipsKeysInFlight", testNextBatchSkipsKeysInFlight},
	{"KeepsItsClaim", testBatchKeepsItsClaim},
	{"LosesItsMessagesOneByOne", testBatchLosesItsMessagesOneByOne},
	{"ContextEndsBeforeTakeover", testBatchContextEndsBeforeTakeover},
}

// batchRecorder is an outbox.BatchSink over a Recorder: each call
// publishes its envelopes to the Recorder in turn and keeps their IDs,
// after waiting for hold, when set, to return a channel that is closed (or
// nil). Its Publish fails the test: a relay gives a BatchSink whole
// batches.
type batchRecorder struct {
	t   testing.TB
	rec *outboxtest.Recorder

	mu      sync.Mutex
	calls   [][]string
	ctxs    []context.Context
	hold    func(call int) <-chan struct{}
	changed chan struct{} // closed and replaced at every call
}

func newBatchRecorder(t testing.TB) *batchRecorder {
	return &batchRecorder{t: t, rec: outboxtest.NewRecorder(), changed: make(chan struct{})}
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
	close(b.changed)
	b.changed = make(chan struct{})
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

// holdCalls makes every call wait until free is called; free it before
// the relay stops (Run waits for the call).
func (b *batchRecorder) holdCalls() (free func()) {
	release := make(chan struct{})
	b.mu.Lock()
	b.hold = func(int) <-chan struct{} { return release }
	b.mu.Unlock()
	return sync.OnceFunc(func() { close(release) })
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

// awaitCall waits for call i, for at most 10s, and fails t without it.
func (b *batchRecorder) awaitCall(t *testing.T, i int) ([]string, context.Context) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		b.mu.Lock()
		changed := b.changed
		b.mu.Unlock()
		if ids, ctx, ok := b.call(i); ok {
			return ids, ctx
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("no call %d of the sink within 10s", i)
		}
	}
}

// testBatchSinkMixedOutcomes: a BatchSink is given a claimed batch in one
// call, and each envelope's outcome is marked on its own: those it
// confirms done at their first attempt, the one it fails waiting for a
// retry (and done at its second), the one it refuses permanently dead at
// once, the one it suspends suspended without an attempt counted. A row
// of the batch that cannot be read is set apart before the call, dead
// with its decode error.
func testBatchSinkMixedOutcomes(t *testing.T, tg Target) {
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
		ok = append(ok, enqueue(t, tg, fmt.Sprintf("ok-%d", i), outbox.Message{Topic: "ok"})...)
	}
	flaky := enqueue(t, tg, "flaky", outbox.Message{Topic: "flaky"})[0]
	bad := enqueue(t, tg, "bad", outbox.Message{Topic: "bad"})[0]
	wait := enqueue(t, tg, "wait", outbox.Message{Topic: "wait"})[0]
	unreadable := enqueue(t, tg, "unreadable", outbox.Message{Topic: "ok"})[0]
	corrupt(t, tg, unreadable)

	ev := start(t, tg.NewRelay, sink)
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
		if r := mustRow(t, tg, id); r.State != lifecycle.Done || r.Attempts != 1 {
			t.Errorf("confirmed %s: %v, want done at attempt 1", id, r)
		}
	}
	if r := ev.Of(relay.EventRetried); len(r) != 1 || r[0].ID != flaky || r[0].Attempt != 1 {
		t.Errorf("retried events %+v, want the flaky message's first attempt", r)
	}
	if r := mustRow(t, tg, flaky); r.State != lifecycle.Done || r.Attempts != 2 {
		t.Errorf("failed once %s: %v, want done at attempt 2", flaky, r)
	}
	if r := mustRow(t, tg, bad); r.State != lifecycle.Dead || r.Attempts != 1 || r.lastError() != relay.CodeRefused+": invalid subject" {
		t.Errorf("refused %s: %v", bad, r)
	}
	if r := mustRow(t, tg, wait); r.State != lifecycle.Suspended || r.Attempts != 0 {
		t.Errorf("suspended %s: %v, want no attempt counted", wait, r)
	}
	if r := mustRow(t, tg, unreadable); r.State != lifecycle.Dead || r.Attempts != 1 ||
		!strings.Contains(r.lastError(), relay.CodeUnreadable+": row ") || !strings.Contains(r.lastError(), "column headers") {
		t.Errorf("unreadable %s: %v", unreadable, r)
	}
	for _, p := range ev.Of(relay.EventPublished) {
		if p.Age <= 0 || p.Duration <= 0 {
			t.Errorf("published event %+v", p)
		}
	}
	sink.rec.ExpectOnceEach(t, append(ok, flaky))
	reliability.Report(t, reliability.Result{Scenario: "outbox: a batch sink confirms some envelopes of a call and fails others", Store: tg.Engine,
		Operations: 9, Faults: 4, Note: "a claim of 9, one row unreadable: set apart, dead with its decode error; one PublishBatch of the other 8: 5 confirmed done at attempt 1; one failed, retried and done at attempt 2; one refused permanently, dead at once; one suspended, no attempt counted"})
}

// testNextBatchSkipsKeysInFlight: while the sink holds a batch, the relay
// claims the next one, which takes no message of an ordering key whose
// message is in flight, however due: those wait for the batch's done
// marks, and every key's messages are published in order.
func testNextBatchSkipsKeysInFlight(t *testing.T, tg Target) {
	// In row order: the first message of keys a, b and c, their second
	// ones, then three keys of one message.
	var firsts, seconds, others []string
	for _, k := range []string{"a", "b", "c"} {
		firsts = append(firsts, enqueue(t, tg, k+"1", outbox.Message{Topic: "t", OrderingKey: k})...)
	}
	for _, k := range []string{"a", "b", "c"} {
		seconds = append(seconds, enqueue(t, tg, k+"2", outbox.Message{Topic: "t", OrderingKey: k})...)
	}
	for _, k := range []string{"d", "e", "f"} {
		others = append(others, enqueue(t, tg, k+"1", outbox.Message{Topic: "t", OrderingKey: k})...)
	}
	sink := newBatchRecorder(t)
	release := make(chan struct{})
	sink.hold = func(call int) <-chan struct{} {
		if call == 0 {
			return release
		}
		return nil
	}
	free := sync.OnceFunc(func() { close(release) })
	defer free() // before the relay stops: Run waits for the call
	ev := start(t, tg.NewRelay, sink, relay.WithBatchSize(3))
	// The first batch is with the sink; the next one is claimed meanwhile.
	ev.Await(t, 10*time.Second, "two claims", func() bool { return len(ev.Of(relay.EventClaimed)) >= 2 })
	if first, _, _ := sink.call(0); !slices.Equal(first, firsts) {
		t.Fatalf("the first batch presented %v, want %v", first, firsts)
	}
	for _, id := range append(slices.Clone(firsts), others...) {
		if r := mustRow(t, tg, id); r.State != lifecycle.Claimed {
			t.Errorf("%s: %s while the first batch is in flight, want claimed", id, r.State)
		}
	}
	for _, id := range seconds {
		if r := mustRow(t, tg, id); r.State != lifecycle.Ready {
			t.Errorf("%s, whose key's message is in flight: %s, want ready", id, r.State)
		}
	}
	if n := len(ev.Of(relay.EventClaimed)); n != 2 {
		t.Errorf("%d claims while the sink holds the first batch, want 2 (one claimed ahead)", n)
	}
	free()
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
	awaitAllDone(t, tg, 5*time.Second)
}

// testBatchKeepsItsClaim: a BatchSink that works for several leases keeps
// the claim on its batch (extended every third of a lease) while a second
// relay polls the table: each message is presented once and done at its
// first attempt.
func testBatchKeepsItsClaim(t *testing.T, tg Target) {
	const lease = 300 * time.Millisecond
	ids := enqueueN(t, tg, "slow", 4, 1)
	sink := newBatchRecorder(t)
	sink.hold = func(call int) <-chan struct{} {
		ch := make(chan struct{})
		time.AfterFunc(4*lease, func() { close(ch) })
		return ch
	}
	evA := start(t, tg.NewRelay, sink, relay.WithName("a"), relay.WithClaimLease(lease))
	sink.awaitCall(t, 0)
	other := outboxtest.NewRecorder()
	evB := start(t, tg.NewPeerRelay, other, relay.WithName("b"), relay.WithClaimLease(lease), relay.WithPollInterval(20*time.Millisecond))
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
		if r := mustRow(t, tg, id); r.State != lifecycle.Done || r.Attempts != 1 {
			t.Errorf("%s: %v, want done at attempt 1", id, r)
		}
	}
}

// held is a relay whose sink holds its first call, of three messages.
type held struct {
	ids  []string
	ev   *events
	ctx  context.Context // the call's
	free func()          // lets the sink's calls return; call it before the relay stops
}

// startHeld enqueues three messages of keys of their own to tg and runs the
// relay newRelay returns through a batchRecorder whose calls wait for
// free, until the relay presented the three in one call.
func startHeld(t *testing.T, tg Target, newRelay func(outbox.Sink, ...relay.Option) *relay.Relay, opts ...relay.Option) held {
	t.Helper()
	ids := enqueueN(t, tg, "k", 3, 1)
	sink := newBatchRecorder(t)
	h := held{ids: ids, free: sink.holdCalls()}
	h.ev = start(t, newRelay, sink, opts...)
	presented, callCtx := sink.awaitCall(t, 0)
	if len(presented) != len(ids) {
		h.free()
		t.Fatalf("presented %v, want the 3 messages in one call", presented)
	}
	h.ctx = callCtx
	return h
}

// testBatchLosesItsMessagesOneByOne: a message of a batch in flight that
// an operator cancels is lost alone: the call's context goes on for the
// others, and the canceled message's done mark is refused though the sink
// confirmed it. Once the other messages are suspended too, the call's
// context is cancelled, with a cause wrapping ErrClaimLost, and their
// marks are refused.
func testBatchLosesItsMessagesOneByOne(t *testing.T, tg Target) {
	h := startHeld(t, tg, tg.NewRelay, relay.WithClaimLease(300*time.Millisecond))
	defer h.free()
	ids, ev, callCtx := h.ids, h.ev, h.ctx
	if _, err := tg.Table.Cancel(ctx, tg.DB, ids[:1], "refunded"); err != nil {
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
	if _, err := tg.Table.Suspend(ctx, tg.DB, lifecycle.Selector{IDs: ids[1:]}, "investigating"); err != nil {
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
	h.free() // the sink confirms them all
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
	if st := statuses(t, tg); st[lifecycle.Canceled] != 1 || st[lifecycle.Suspended] != 2 || len(st) != 2 {
		t.Errorf("statuses %v, want 1 canceled and 2 suspended", st)
	}
}

// testBatchContextEndsBeforeTakeover: a relay whose sink holds a batch
// (ignoring its context) loses its database: its extends fail, and it
// cancels the call's context, with a cause wrapping ErrClaimLost, before
// the claim could run out and another relay, polling, take the batch
// back; that relay publishes it again, and the first relay's marks,
// once its database is back, change nothing.
func testBatchContextEndsBeforeTakeover(t *testing.T, tg Target) {
	const lease = 500 * time.Millisecond
	newA, dbA := stallable(tg)
	h := startHeld(t, tg, newA, relay.WithName("a"), relay.WithClaimLease(lease))
	defer h.free()
	ids, evA, callCtx := h.ids, h.ev, h.ctx
	other := outboxtest.NewRecorder()
	evB := start(t, tg.NewPeerRelay, other, relay.WithName("b"), relay.WithClaimLease(lease), relay.WithPollInterval(20*time.Millisecond))
	dbA.stall() // a's extends get no answer
	select {
	case <-callCtx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the call's context was not cancelled while the relay could not extend its claim")
	}
	if cause := context.Cause(callCtx); !errors.Is(cause, outbox.ErrClaimLost) {
		t.Errorf("the call's context ended with %v, want a cause wrapping ErrClaimLost", cause)
	}
	evA.Await(t, 5*time.Second, "3 claims lost", func() bool { return len(evA.Of(relay.EventClaimLost)) == 3 })
	evB.Await(t, 10*time.Second, "the other relay's 3 publishes", func() bool { return len(evB.Of(relay.EventPublished)) == 3 })
	// The call's context ended before the loss was reported.
	if lost, taken := evA.firstAt(relay.EventClaimLost), evB.firstAt(relay.EventReclaimed); !lost.Before(taken) {
		t.Errorf("a gave its batch up at %v, not before b took it back at %v", lost, taken)
	}
	for _, d := range other.Deliveries() {
		if d.Attempt != 2 {
			t.Errorf("b presented %s at attempt %d, want 2 (a's claim counted)", d.ID, d.Attempt)
		}
	}
	dbA.restore()
	h.free() // the sink confirms the batch
	evA.Await(t, 10*time.Second, "a's fenced marks", func() bool { return len(evA.Of(relay.EventFenced)) == 3 })
	for _, f := range evA.Of(relay.EventFenced) {
		if f.State != lifecycle.Done || !f.Published {
			t.Errorf("fenced event %+v, want a published message found done", f)
		}
	}
	other.ExpectOnceEach(t, ids)
	awaitAllDone(t, tg, 5*time.Second)
}
