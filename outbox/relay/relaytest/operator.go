package relaytest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/internal/outboxtest"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/outbox/relay"
)

var operatorTests = []test{
	{"CanceledWhilePresented", testCanceledWhilePresented},
	{"SuspendedWhilePresented", testSuspendedWhilePresented},
}

// testCanceledWhilePresented: a message canceled while its sink works has
// the sink's context cancelled, with a cause wrapping ErrClaimLost, at the
// relay's next extend; its done mark is refused, though the sink
// confirmed it, and it stays canceled.
func testCanceledWhilePresented(t *testing.T, tg Target) {
	const lease = 600 * time.Millisecond
	ids := enqueue(t, tg, "k", outbox.Message{Topic: "t"}, outbox.Message{Topic: "next"})
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
	ev := start(t, tg.NewRelay, sink, relay.WithClaimLease(lease))
	<-started
	canceled, err := tg.Table.Cancel(ctx, tg.DB, ids[:1], "refunded")
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
	ev.Await(t, 5*time.Second, "canceled, claim lost", func() bool {
		return len(ev.Of(relay.EventCanceled)) == 1 && len(ev.Of(relay.EventClaimLost)) == 1
	})
	if c := ev.Of(relay.EventCanceled)[0]; c.ID != ids[0] || !c.Published {
		t.Errorf("canceled event %+v", c)
	}
	if l := ev.Of(relay.EventClaimLost); len(l) != 1 || l[0].State != lifecycle.Canceled || !errors.Is(l[0].Err, outbox.ErrClaimLost) {
		t.Errorf("claim lost events %+v", l)
	}
	for _, p := range ev.Of(relay.EventPublished) {
		if p.ID == ids[0] {
			t.Error("the canceled message was reported published")
		}
	}
	if r := mustRow(t, tg, ids[0]); r.State != lifecycle.Canceled || r.Attempts != 0 || r.lastError() != "canceled: refunded" {
		t.Errorf("row %v", r)
	}
	// The next message of the key is not held back by a canceled one.
	if err := rec.AwaitIDs(10*time.Second, ids[1]); err != nil {
		t.Fatal(err)
	}
}

// testSuspendedWhilePresented: an operator's suspension of a message the
// sink works on cancels the sink's context at the next extend and refuses
// the relay's mark; once resumed, the message is presented again without
// an attempt counted for the suspension.
func testSuspendedWhilePresented(t *testing.T, tg Target) {
	id := enqueue(t, tg, "k", outbox.Message{Topic: "t"})[0]
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
	// The poll finds the resumed message where the engine has no
	// notifications.
	ev := start(t, tg.NewRelay, sink, relay.WithClaimLease(300*time.Millisecond), relay.WithPollInterval(100*time.Millisecond))
	<-started
	if got, err := tg.Table.Suspend(ctx, tg.DB, lifecycle.Selector{IDs: []string{id}}, "investigating"); err != nil || len(got) != 1 {
		t.Fatalf("suspend: %+v, %v", got, err)
	}
	ev.Await(t, 10*time.Second, "fenced", func() bool { return len(ev.Of(relay.EventFenced)) == 1 })
	if f := ev.Of(relay.EventFenced)[0]; f.State != lifecycle.Suspended || f.Published {
		t.Errorf("fenced event %+v, want the suspended state", f)
	}
	if r := mustRow(t, tg, id); r.State != lifecycle.Suspended || r.Attempts != 0 {
		t.Fatalf("row %v, want suspended, no attempt counted", r)
	}
	resume(t, tg, lifecycle.Selector{IDs: []string{id}})
	if err := rec.AwaitIDs(10*time.Second, id); err != nil {
		t.Fatal(err)
	}
	if d := rec.Deliveries(); d[0].Attempt != 1 {
		t.Errorf("presented again at attempt %d, want 1: a suspension counts none", d[0].Attempt)
	}
}
