package idemrabbit_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/go-idempotency/idempotency"
	idemrabbit "github.com/go-idempotency/idempotency/brokers/rabbitmq"
	"github.com/go-idempotency/idempotency/memstore"
	"github.com/go-idempotency/idempotency/outbox/relay"
	"github.com/go-idempotency/idempotency/pgstore"
)

// A relay that publishes the outbox to RabbitMQ with publisher confirms:
// each message to the queue its topic names (the default exchange).
func ExampleNewSink() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	sink := idemrabbit.NewSink("amqp://guest:guest@127.0.0.1:5672/")
	defer sink.Close()
	if err := relay.New(pool, sink).Run(ctx); err != nil && ctx.Err() == nil {
		log.Fatal(err)
	}
}

// A consumer that applies each message once per message_id: its row
// commits with the message's record, and a message delivered twice (the
// relay delivers at least once) is acked without a second row. The queue
// is a quorum queue with x-delivery-limit 20 and a dead-letter exchange;
// the Processor, told the limit, reports the last delivery of a message
// it could not apply.
func ExampleNewProcessor() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store := pgstore.New(pool)
	defer store.Close()
	runner := idempotency.NewRunner(store, idempotency.WithTransaction(true), idempotency.WithWait(10*time.Second))
	apply := func(ctx context.Context, d amqp.Delivery) (string, error) {
		tx, _ := pgstore.TxFromContext(ctx)
		_, err := tx.Exec(ctx, `INSERT INTO ledger (message_id, body) VALUES ($1, $2)`, d.MessageId, d.Body)
		return "applied", err
	}
	p := idemrabbit.NewProcessor(runner, "ledger.apply", apply,
		idemrabbit.WithDeliveryLimit(20),
		idemrabbit.WithErrorHandler(func(ctx context.Context, d amqp.Delivery, err error) {
			if errors.Is(err, idemrabbit.ErrLastDelivery) {
				log.Printf("message %s dead-lettered: %v", d.MessageId, err)
			}
		}))

	conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	// Process holds a failing delivery for its backoff, and a duplicate
	// while another consumer holds its key: handle a few at once.
	const workers = 8
	if err := ch.Qos(workers, 0, false); err != nil {
		log.Fatal(err)
	}
	deliveries, err := ch.Consume("payment.created", "", false, false, false, false, nil)
	if err != nil {
		log.Fatal(err)
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for d := range deliveries {
				p.Process(ctx, d)
			}
		})
	}
	wg.Wait()
}

// printAcks is an amqp.Acknowledger that prints what it is sent, in place
// of a broker's channel.
type printAcks struct{}

func (printAcks) Ack(uint64, bool) error { fmt.Println("ack"); return nil }
func (printAcks) Nack(_ uint64, _, requeue bool) error {
	fmt.Println("nack, requeue:", requeue)
	return nil
}
func (printAcks) Reject(_ uint64, requeue bool) error {
	fmt.Println("reject, requeue:", requeue)
	return nil
}

// The last delivery of a quorum queue with x-delivery-limit 3 is its
// 4th (x-delivery-count 3): when its handler fails, it is rejected rather
// than requeued, so that the queue dead-letters it, and reported.
func ExampleWithDeliveryLimit() {
	store := memstore.New()
	defer store.Close()
	p := idemrabbit.NewProcessor(idempotency.NewRunner(store), "payments.apply",
		func(context.Context, amqp.Delivery) (string, error) { return "", errors.New("card service down") },
		idemrabbit.WithDeliveryLimit(3),
		idemrabbit.WithErrorHandler(func(context.Context, amqp.Delivery, error) {}))

	d := amqp.Delivery{
		Acknowledger: printAcks{},
		MessageId:    "pay_7/1",
		Body:         []byte(`{"amount":1999}`),
		Redelivered:  true,
		Headers:      amqp.Table{"x-delivery-count": int64(3)},
	}
	_, s, err := p.Process(context.Background(), d)
	fmt.Println(s.Action, s.Delivery, s.Final)
	fmt.Println(err)
	// Output:
	// reject, requeue: false
	// reject 4 true
	// idemrabbit: last delivery (delivery 4, x-delivery-limit 3), rejected: released: card service down
}

// A message that reaches the queue twice under one message_id (the relay
// published it again) is applied once: the second delivery replays the
// first one's result and is acked.
func ExampleProcessor_Process() {
	store := memstore.New()
	defer store.Close()
	applied := 0
	p := idemrabbit.NewProcessor(idempotency.NewRunner(store), "ledger.apply",
		func(context.Context, amqp.Delivery) (string, error) {
			applied++
			return fmt.Sprint("ledger row ", applied), nil
		})

	for range 2 {
		d := amqp.Delivery{Acknowledger: printAcks{}, MessageId: "pay_7/1", Body: []byte(`{"amount":1999}`)}
		res, s, err := p.Process(context.Background(), d)
		fmt.Println(res.Value, "replayed:", res.Replayed, s.Action, err)
	}
	fmt.Println("applied", applied, "time(s)")
	// Output:
	// ack
	// ledger row 1 replayed: false ack <nil>
	// ack
	// ledger row 1 replayed: true ack <nil>
	// applied 1 time(s)
}
