package relaytest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/internal/outboxtest"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/outbox/relay"
)

var claimTests = []test{
	{"FencedAfterTakeover", testFencedAfterTakeover},
	{"LongPublishKeepsItsClaim", testLongPublishKeepsItsClaim},
	{"ReleasedWhenStopping", testReleasedWhenStopping},
}

// testFencedAfterTakeover: a relay loses its database while its sink
// stalls (ignoring its context): its extends fail, so it cancels the
// sink's context (ErrClaimLost) before its claim could run out, which
// the other relay, polling, takes back only afterwards and presents
// again. The first relay's done mark, once its sink returns and its
// database is back, changes nothing while the other relay holds the
// message, which the other relay's mark then finishes.
func testFencedAfterTakeover(t *testing.T, tg Target) {
	const lease = 500 * time.Millisecond
	id := enqueue(t, tg, "k", outbox.Message{Topic: "t"})[0]
	stalled := make(chan struct{})
	resume := make(chan struct{})
	cause := make(chan error, 1)
	slow := outbox.SinkFunc(func(ctx context.Context, e outbox.Envelope) error {
		close(stalled)
		<-resume
		cause <- context.Cause(ctx)
		return nil
	})
	newA, dbA := stallable(tg)
	evA := start(t, newA, slow, relay.WithName("a"), relay.WithClaimLease(lease))
	<-stalled
	fast := outboxtest.NewRecorder()
	presentedB := make(chan struct{}, 1)
	holdB := make(chan struct{})
	fast.HangWith(func(outbox.Envelope) <-chan struct{} {
		presentedB <- struct{}{}
		return holdB
	})
	freeB := sync.OnceFunc(func() { close(holdB) })
	defer freeB() // before b stops: Run waits for its sink
	evB := start(t, tg.NewPeerRelay, fast, relay.WithName("b"), relay.WithClaimLease(lease), relay.WithPollInterval(20*time.Millisecond))
	dbA.stall() // a's extends get no answer
	evA.Await(t, 10*time.Second, "a's claim lost", func() bool { return len(evA.Of(relay.EventClaimLost)) == 1 })
	select {
	case <-presentedB:
	case <-time.After(10 * time.Second):
		t.Fatal("b did not present the message within 10s")
	}
	if lost, taken := evA.firstAt(relay.EventClaimLost), evB.firstAt(relay.EventReclaimed); !lost.Before(taken) {
		t.Errorf("a gave its claim up at %v, not before b took it back at %v", lost, taken)
	}
	// While b presents it, a's sink returns and a's database is back.
	dbA.restore()
	close(resume)
	if err := <-cause; !errors.Is(err, outbox.ErrClaimLost) {
		t.Errorf("a's sink context ended with %v, want a cause wrapping ErrClaimLost", err)
	}
	evA.Await(t, 10*time.Second, "a's fenced mark", func() bool { return len(evA.Of(relay.EventFenced)) == 1 })
	if f := evA.Of(relay.EventFenced)[0]; f.ID != id || !f.Published || f.State != lifecycle.Claimed {
		t.Errorf("fenced event %+v, want %s published, found claimed (by b)", f, id)
	}
	if r := mustRow(t, tg, id); r.State != lifecycle.Claimed || r.ClaimedBy != "b" || r.Attempts != 1 {
		t.Errorf("row %v after a's mark, want claimed by b, a's attempt counted", r)
	}
	freeB()
	evB.Await(t, 10*time.Second, "b's publish", func() bool { return len(evB.Of(relay.EventPublished)) == 1 })
	if d := fast.Deliveries(); d[0].Attempt != 2 {
		t.Errorf("b presented attempt %d, want 2 (a's claim counted)", d[0].Attempt)
	}
	if l := evA.Of(relay.EventClaimLost)[0]; l.ID != id || !errors.Is(l.Err, outbox.ErrClaimLost) {
		t.Errorf("claim lost event %+v", l)
	}
	if len(evA.Of(relay.EventPublished)) != 0 {
		t.Error("a reported its lost message as published")
	}
	if r := mustRow(t, tg, id); r.State != lifecycle.Done || r.Attempts != 2 || r.ClaimedBy != "b" {
		t.Errorf("row %v, want done by b after 2 attempts", r)
	}
	if fast.Count(id) != 1 {
		t.Errorf("b delivered %d times, want 1", fast.Count(id))
	}
	reliability.Report(t, reliability.Result{Scenario: "outbox: a relay cut from its database while its sink stalls", Store: tg.Engine,
		Operations: 2, Faults: 1, Note: "its extends failed: it cancelled the sink's context (ErrClaimLost) before its 500ms lease ran out and another relay took the message back; presented again (same ID, attempt 2); the first relay's done mark, sent while the other held the message, fenced"})
}

// testLongPublishKeepsItsClaim: a sink that works for several leases
// keeps the claim (extended every third of a lease) while a second relay
// polls the table: the message is presented once, confirmed once, and
// done at its first attempt.
func testLongPublishKeepsItsClaim(t *testing.T, tg Target) {
	const lease = 300 * time.Millisecond
	id := enqueue(t, tg, "slow", outbox.Message{Topic: "t"})[0]
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
	evA := start(t, tg.NewRelay, slow, relay.WithName("a"), relay.WithClaimLease(lease))
	<-started
	other := outboxtest.NewRecorder()
	evB := start(t, tg.NewPeerRelay, other, relay.WithName("b"), relay.WithClaimLease(lease), relay.WithPollInterval(20*time.Millisecond))
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
	if r := mustRow(t, tg, id); r.State != lifecycle.Done || r.Attempts != 1 {
		t.Errorf("row %v, want done at attempt 1", r)
	}
	reliability.Report(t, reliability.Result{Scenario: "outbox: a publish longer than the claim lease", Store: tg.Engine,
		Operations: 1, Note: "a sink working 4 leases of 300ms kept its claim (extended every 100ms) beside another relay polling every 20ms: presented once, done at attempt 1"})
}

// testReleasedWhenStopping: when Run's context ends mid-batch, the
// publish in flight runs to its end and is marked, and the messages
// whose turn had not come are handed back, ready, no attempt counted.
func testReleasedWhenStopping(t *testing.T, tg Target) {
	ids := enqueueN(t, tg, "k", 3, 1)
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
	r := tg.NewRelay(sink, relay.WithObserver(ev.Observe))
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
	if st := statuses(t, tg); st[lifecycle.Done] != 1 || st[lifecycle.Ready] != 2 {
		t.Errorf("after the stop: %v", st)
	}
	for _, id := range ids {
		if r := mustRow(t, tg, id); r.State == lifecycle.Ready && r.Attempts != 0 {
			t.Errorf("%s handed back with %d attempts", id, r.Attempts)
		}
	}
}
