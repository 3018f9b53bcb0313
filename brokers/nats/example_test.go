package idemnats_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/go-idempotency/idempotency"
	idemnats "github.com/go-idempotency/idempotency/brokers/nats"
	"github.com/go-idempotency/idempotency/memstore"
	"github.com/go-idempotency/idempotency/pgstore"
)

type Receipt struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

func charge(ctx context.Context, msg jetstream.Msg) (Receipt, error) {
	info, _ := idempotency.FromContext(ctx)
	return Receipt{ID: "ch_" + info.StorageKey[:8], Amount: 1999}, nil
}

// A consumer that charges each order once, however often its message is
// published or delivered: the key is the Order-Id header, and a message is
// acked only after its record completed.
func Example() {
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Drain()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	cons, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{
		Durable:   "charger",
		AckPolicy: jetstream.AckExplicitPolicy,
		AckWait:   30 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}

	store := memstore.New()
	defer store.Close()
	r := idempotency.NewRunner(store, idempotency.WithLease(30*time.Second))
	p := idemnats.NewProcessor(r, "orders.charge", charge, idemnats.WithKey(idemnats.HeaderKey("Order-Id")))
	if err := p.Consume(ctx, cons); err != nil {
		log.Fatal(err)
	}
}

// On pgstore with a transactional Runner, the handler's writes commit with
// the record: once per key, whatever dies or is redelivered.
func ExampleNewProcessor_transaction() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@127.0.0.1:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store := pgstore.New(pool)
	defer store.Close()
	r := idempotency.NewRunner(store, idempotency.WithTransaction(true))

	p := idemnats.NewProcessor(r, "orders.ship", func(ctx context.Context, msg jetstream.Msg) (string, error) {
		tx, _ := pgstore.TxFromContext(ctx)
		info, _ := idempotency.FromContext(ctx)
		_, err := tx.Exec(ctx, "INSERT INTO shipments (order_id, epoch) VALUES ($1, $2)", info.Key, info.Epoch)
		return "shipped", err
	}, idemnats.WithKey(idemnats.HeaderKey("Order-Id")))
	_ = p // p.Consume(ctx, consumer)
}

// Process handles messages fetched by the caller's own loop; WithAckWait
// and WithMaxDeliver tell it the consumer's AckWait, to space its
// in-progress acks, and MaxDeliver, to recognise a message's last
// delivery.
func ExampleProcessor_Process() {
	var cons jetstream.Consumer // from js.Consumer or js.CreateOrUpdateConsumer: AckWait 10s, MaxDeliver 5
	r := idempotency.NewRunner(memstore.New())
	p := idemnats.NewProcessor(r, "orders.charge", charge,
		idemnats.WithAckWait(10*time.Second), idemnats.WithMaxDeliver(5))

	ctx := context.Background()
	batch, err := cons.Fetch(10)
	if err != nil {
		log.Fatal(err)
	}
	for msg := range batch.Messages() {
		out, err := p.Process(ctx, msg)
		switch {
		case out.LastDelivery: // termed: nothing will retry it
			fmt.Println("dead-letter", msg.Subject(), err)
		case err != nil:
			fmt.Println(out.Action, out.Reason, err) // also reported to the error handler
		default:
			fmt.Println(out.Action, "replayed:", out.Replayed)
		}
	}
}
