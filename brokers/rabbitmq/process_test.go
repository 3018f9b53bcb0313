package idemrabbit_test

import (
	"context"
	"errors"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/go-idempotency/idempotency"
	idemrabbit "github.com/go-idempotency/idempotency/brokers/rabbitmq"
	"github.com/go-idempotency/idempotency/brokers/rabbitmq/rabbittest"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/memstore"
	"github.com/go-idempotency/idempotency/pgstore"
)

func memRunner(t testing.TB, opts ...idempotency.Option) *idempotency.Runner {
	t.Helper()
	s := memstore.New()
	t.Cleanup(func() { _ = s.Close() })
	return idempotency.NewRunner(s, opts...)
}

// TestProcessOncePerMessageID: a message published twice (the relay's at
// least once) reaches the queue twice; the handler runs for the first
// delivery, the second replays, and both are acked.
func TestProcessOncePerMessageID(t *testing.T) {
	queue := rabbittest.Queue(t)
	sink := newSink(t)
	e := envelope("k7/1", queue, `{"amount":1999}`)
	for range 2 {
		if err := sink.Publish(context.Background(), e); err != nil {
			t.Fatal(err)
		}
	}
	r := memRunner(t)
	ds := consume(t, queue)
	runs := 0
	apply := func(ctx context.Context, d amqp.Delivery) (int, error) {
		runs++
		return runs, nil
	}
	for i, wantReplayed := range []bool{false, true} {
		res, s, err := idemrabbit.Process(context.Background(), r, "payments.apply", next(t, ds), apply)
		if err != nil || s != idemrabbit.Acked || res.Replayed != wantReplayed || res.Value != 1 {
			t.Fatalf("delivery %d: %+v, %v, %v", i+1, res, s, err)
		}
	}
	if runs != 1 {
		t.Fatalf("the handler ran %d times, want 1", runs)
	}
}

// TestProcessRequeuesOnError: a handler's error releases the key and
// requeues the delivery; its redelivery runs the handler again.
func TestProcessRequeuesOnError(t *testing.T) {
	queue := rabbittest.Queue(t)
	if err := newSink(t).Publish(context.Background(), envelope("k8/1", queue, "p")); err != nil {
		t.Fatal(err)
	}
	r := memRunner(t)
	ds := consume(t, queue)
	fail := errors.New("provider down")
	_, s, err := idemrabbit.Process(context.Background(), r, "payments.apply", next(t, ds), func(context.Context, amqp.Delivery) (string, error) {
		return "", fail
	})
	if s != idemrabbit.Requeued || !errors.Is(err, fail) {
		t.Fatalf("failing handler: %v, %v", s, err)
	}
	d := next(t, ds)
	res, s, err := idemrabbit.Process(context.Background(), r, "payments.apply", d, func(context.Context, amqp.Delivery) (string, error) {
		return "applied", nil
	})
	if !d.Redelivered || s != idemrabbit.Acked || err != nil || res.Value != "applied" || res.Replayed {
		t.Fatalf("redelivery (redelivered %v): %+v, %v, %v", d.Redelivered, res, s, err)
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
	r := memRunner(t)
	ds := consume(t, queue)
	runs := 0
	apply := func(context.Context, amqp.Delivery) (int, error) { runs++; return runs, nil }
	for i, want := range []struct {
		s   idemrabbit.Settlement
		err error
	}{
		{idemrabbit.Rejected, idemrabbit.ErrNoMessageID},
		{idemrabbit.Acked, nil},
		{idemrabbit.Rejected, idempotency.ErrFingerprintMismatch},
	} {
		_, s, err := idemrabbit.Process(context.Background(), r, "payments.apply", next(t, ds), apply)
		if s != want.s || (want.err == nil) != (err == nil) || (want.err != nil && !errors.Is(err, want.err)) {
			t.Fatalf("delivery %d: %v, %v; want %v, %v", i+1, s, err, want.s, want.err)
		}
	}
	if runs != 1 {
		t.Fatalf("the handler ran %d times, want 1", runs)
	}
}

// TestProcessTransactional: on pgstore with WithTransaction(true), the
// handler's row commits with the record: two deliveries of one message
// make one row.
func TestProcessTransactional(t *testing.T) {
	pool := pgtest.Pool(t)
	ctx := context.Background()
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE applied (message_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	store := pgstore.New(pool)
	t.Cleanup(func() { _ = store.Close() })
	r := idempotency.NewRunner(store, idempotency.WithTransaction(true))

	queue := rabbittest.Queue(t)
	sink := newSink(t)
	for range 2 {
		if err := sink.Publish(ctx, envelope("k10/1", queue, "p")); err != nil {
			t.Fatal(err)
		}
	}
	ds := consume(t, queue)
	for range 2 {
		_, s, err := idemrabbit.Process(ctx, r, "payments.apply", next(t, ds), func(ctx context.Context, d amqp.Delivery) (string, error) {
			tx, _ := pgstore.TxFromContext(ctx)
			_, err := tx.Exec(ctx, `INSERT INTO applied VALUES ($1)`, d.MessageId)
			return "ok", err
		})
		if err != nil || s != idemrabbit.Acked {
			t.Fatalf("%v, %v", s, err)
		}
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM applied`).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("%d rows (%v), want 1", rows, err)
	}
}
