package idemrabbit_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/go-idempotency/idempotency"
	idemrabbit "github.com/go-idempotency/idempotency/brokers/rabbitmq"
	"github.com/go-idempotency/idempotency/brokers/rabbitmq/rabbittest"
	"github.com/go-idempotency/idempotency/pgstore"
)

// quiet is an error handler for tests that check the errors Process
// returns instead.
func quiet(context.Context, amqp.Delivery, error) {}

// TestProcessOncePerMessageID: a message published twice (the relay's at
// least once) reaches the queue twice; the handler runs for the first
// delivery, the second replays, and both are acked.
func TestProcessOncePerMessageID(t *testing.T) {
	queue := rabbittest.Queue(t)
	for range 2 {
		publish(t, queue, "k7/1", `{"amount":1999}`)
	}
	runs := 0
	p := idemrabbit.NewProcessor(memRunner(t), "payments.apply", func(ctx context.Context, d amqp.Delivery) (int, error) {
		runs++
		return runs, nil
	})
	ds := subscribe(t, queue, 2)
	for i, wantReplayed := range []bool{false, true} {
		res, s, err := p.Process(context.Background(), next(t, ds))
		if err != nil || s.Action != idemrabbit.Ack || res.Replayed != wantReplayed || res.Value != 1 {
			t.Fatalf("delivery %d: %+v, %+v, %v", i+1, res, s, err)
		}
	}
	if runs != 1 {
		t.Fatalf("the handler ran %d times, want 1", runs)
	}
}

// TestProcessRequeuesAfterBackoff: a handler's error releases the key;
// the delivery is held for the backoff's first step and then requeued,
// and its redelivery runs the handler again.
func TestProcessRequeuesAfterBackoff(t *testing.T) {
	queue := rabbittest.Queue(t)
	publish(t, queue, "k8/1", "p")
	fail := errors.New("provider down")
	var reported atomic.Int32
	p := idemrabbit.NewProcessor(memRunner(t), "payments.apply", func(_ context.Context, d amqp.Delivery) (string, error) {
		if !d.Redelivered {
			return "", fail
		}
		return "applied", nil
	}, idemrabbit.WithBackoff(100*time.Millisecond, time.Second), idemrabbit.WithErrorHandler(func(_ context.Context, _ amqp.Delivery, err error) {
		if errors.Is(err, fail) {
			reported.Add(1)
		}
	}))
	ds := subscribe(t, queue, 1)
	start := time.Now()
	res, s, err := p.Process(context.Background(), next(t, ds))
	held := time.Since(start)
	if s.Action != idemrabbit.Requeue || !errors.Is(err, fail) || res.Outcome != idempotency.OutcomeReleased {
		t.Fatalf("failing handler: %+v, %+v, %v", res, s, err)
	}
	if s.Delivery != 1 || s.Delay < 50*time.Millisecond || s.Delay >= 100*time.Millisecond || held < s.Delay {
		t.Fatalf("first delivery held %v with delay %v (delivery %d); want a delay in [50ms, 100ms), held as long", held, s.Delay, s.Delivery)
	}
	d := next(t, ds)
	res, s, err = p.Process(context.Background(), d)
	if !d.Redelivered || s.Action != idemrabbit.Ack || s.Delivery != 2 || err != nil || res.Value != "applied" || res.Replayed {
		t.Fatalf("redelivery (redelivered %v): %+v, %+v, %v", d.Redelivered, res, s, err)
	}
	if n := reported.Load(); n != 1 {
		t.Fatalf("the error handler got the handler's error %d times, want 1", n)
	}
}

// TestProcessRejects: a delivery without a message_id, and one whose
// message_id came before with another body, are rejected without running
// the handler.
func TestProcessRejects(t *testing.T) {
	queue := rabbittest.Queue(t)
	ch := rabbittest.Channel(t)
	for _, p := range []amqp.Publishing{
		{Body: []byte("no id")},
		{MessageId: "k9/1", Body: []byte("first")},
		{MessageId: "k9/1", Body: []byte("another body")},
	} {
		if err := ch.PublishWithContext(context.Background(), "", queue, true, false, p); err != nil {
			t.Fatal(err)
		}
	}
	runs := 0
	p := idemrabbit.NewProcessor(memRunner(t), "payments.apply", func(context.Context, amqp.Delivery) (int, error) {
		runs++
		return runs, nil
	}, idemrabbit.WithErrorHandler(quiet))
	ds := subscribe(t, queue, 3)
	for i, want := range []struct {
		a       idemrabbit.Action
		outcome idempotency.Outcome
		err     error
	}{
		{idemrabbit.Reject, idempotency.OutcomeInvalid, idemrabbit.ErrNoMessageID},
		{idemrabbit.Ack, idempotency.OutcomeStored, nil},
		{idemrabbit.Reject, idempotency.OutcomeMismatch, idempotency.ErrFingerprintMismatch},
	} {
		res, s, err := p.Process(context.Background(), next(t, ds))
		if s.Action != want.a || res.Outcome != want.outcome || (want.err == nil) != (err == nil) || (want.err != nil && !errors.Is(err, want.err)) {
			t.Fatalf("delivery %d: %v, %v, %v; want %v, %v, %v", i+1, s.Action, res.Outcome, err, want.a, want.outcome, want.err)
		}
	}
	if runs != 1 {
		t.Fatalf("the handler ran %d times, want 1", runs)
	}
	if n := ready(t, queue); n != 0 {
		t.Fatalf("%d messages back in the queue, want 0", n)
	}
}

// TestProcessPanic: a handler's panic goes on, after the key was
// released and the delivery requeued; the redelivery runs the handler
// again.
func TestProcessPanic(t *testing.T) {
	queue := rabbittest.Queue(t)
	publish(t, queue, "k11/1", "p")
	p := idemrabbit.NewProcessor(memRunner(t), "payments.apply", func(_ context.Context, d amqp.Delivery) (string, error) {
		if !d.Redelivered {
			panic("bug")
		}
		return "applied", nil
	}, idemrabbit.WithBackoff(10*time.Millisecond, 10*time.Millisecond), idemrabbit.WithErrorHandler(quiet))
	ds := subscribe(t, queue, 1)
	func() {
		defer func() {
			if r := recover(); r != "bug" {
				t.Fatalf("recovered %v, want the handler's panic", r)
			}
		}()
		p.Process(context.Background(), next(t, ds))
	}()
	res, s, err := p.Process(context.Background(), next(t, ds))
	if err != nil || s.Action != idemrabbit.Ack || res.Value != "applied" || res.Replayed {
		t.Fatalf("redelivery: %+v, %+v, %v", res, s, err)
	}
}

// TestProcessTransactional: on pgstore with WithTransaction(true), the
// handler's row commits with the record: two deliveries of one message
// make one row.
func TestProcessTransactional(t *testing.T) {
	ctx := context.Background()
	r, pool := pgRunner(t, "applied")

	queue := rabbittest.Queue(t)
	for range 2 {
		publish(t, queue, "k10/1", "p")
	}
	p := idemrabbit.NewProcessor(r, "payments.apply", func(ctx context.Context, d amqp.Delivery) (string, error) {
		tx, _ := pgstore.TxFromContext(ctx)
		_, err := tx.Exec(ctx, `INSERT INTO applied VALUES ($1)`, d.MessageId)
		return "ok", err
	})
	ds := subscribe(t, queue, 2)
	for i, want := range []idempotency.Outcome{idempotency.OutcomeCommitted, idempotency.OutcomeReplayed} {
		res, s, err := p.Process(ctx, next(t, ds))
		if err != nil || s.Action != idemrabbit.Ack || res.Outcome != want {
			t.Fatalf("delivery %d: %v, %+v, %v", i+1, res.Outcome, s, err)
		}
	}
	if n := rows(t, pool, "applied"); n != 1 {
		t.Fatalf("%d rows, want 1", n)
	}
}

// TestProcessWaitEndsWithContext: a delivery whose key another call holds
// stays unacked while Process waits; when ctx ends first, it is requeued
// at once, without the backoff.
func TestProcessWaitEndsWithContext(t *testing.T) {
	queue, _ := quorumQueue(t, -1)
	for range 2 {
		publish(t, queue, "k12/1", "p")
	}
	started, finish := make(chan struct{}), make(chan struct{})
	p := idemrabbit.NewProcessor(memRunner(t), "payments.apply", func(ctx context.Context, d amqp.Delivery) (string, error) {
		close(started)
		<-finish
		return "applied", nil
	}, idemrabbit.WithBackoff(time.Minute, time.Minute), idemrabbit.WithErrorHandler(quiet))
	holderDone := make(chan error, 1)
	// The holder's consumer is cancelled once it has the holder's
	// delivery, which its channel still settles: with room again after
	// that settlement, it could otherwise take the requeued duplicate
	// that ds waits for.
	hch := rabbittest.Channel(t)
	if err := hch.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	holder := next(t, consumeOn(t, hch, queue))
	if err := hch.Cancel(holder.ConsumerTag, false); err != nil {
		t.Fatal(err)
	}
	go func() {
		_, _, err := p.Process(context.Background(), holder)
		holderDone <- err
	}()
	<-started

	ctx, cancel := context.WithCancel(context.Background())
	ds := subscribe(t, queue, 1)
	dup := next(t, ds)
	waiting := make(chan struct{})
	var s idemrabbit.Settlement
	var res idempotency.Result[string]
	var err error
	go func() {
		defer close(waiting)
		res, s, err = p.Process(ctx, dup)
	}()
	select {
	case <-waiting:
		t.Fatalf("Process returned while the holder ran: %+v, %+v, %v", res, s, err)
	case <-time.After(200 * time.Millisecond): // still waiting, the delivery unacked
	}
	cancel()
	canceled := time.Now()
	<-waiting
	// Within a second: the minute of backoff was not held.
	if s.Action != idemrabbit.Requeue || s.Final || res.Outcome.Class() != idempotency.ClassRetry || time.Since(canceled) > time.Second {
		t.Fatalf("%v after ctx ended: %v, %+v, %v", time.Since(canceled), res.Outcome, s, err)
	}
	close(finish)
	if err := <-holderDone; err != nil {
		t.Fatal(err)
	}
	// The requeued duplicate comes back, counted once, and replays.
	d := next(t, ds)
	res, s, err = p.Process(context.Background(), d)
	if err != nil || s.Action != idemrabbit.Ack || !res.Replayed || s.Delivery != 2 {
		t.Fatalf("redelivered duplicate: %+v, %+v, %v", res, s, err)
	}
}
