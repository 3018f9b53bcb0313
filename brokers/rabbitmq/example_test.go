package idemrabbit_test

import (
	"context"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/go-idempotency/idempotency"
	idemrabbit "github.com/go-idempotency/idempotency/brokers/rabbitmq"
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
// relay delivers at least once) is acked without a second row.
func ExampleProcess() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store := pgstore.New(pool)
	defer store.Close()
	runner := idempotency.NewRunner(store, idempotency.WithTransaction(true), idempotency.WithWait(5*time.Second))

	conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	deliveries, err := ch.Consume("payment.created", "", false, false, false, false, nil)
	if err != nil {
		log.Fatal(err)
	}
	apply := func(ctx context.Context, d amqp.Delivery) (string, error) {
		tx, _ := pgstore.TxFromContext(ctx)
		_, err := tx.Exec(ctx, `INSERT INTO ledger (message_id, body) VALUES ($1, $2)`, d.MessageId, d.Body)
		return "applied", err
	}
	for d := range deliveries {
		if _, s, err := idemrabbit.Process(ctx, runner, "ledger.apply", d, apply); err != nil {
			log.Printf("%s: %v", s, err)
		}
	}
}
