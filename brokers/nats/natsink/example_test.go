package natsink_test

import (
	"context"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/go-idempotency/idempotency/brokers/nats/natsink"
	"github.com/go-idempotency/idempotency/outbox/relay"
)

// A relay that publishes the outbox to the stream PAYMENTS, after checking
// that the stream's duplicate window covers the relay's retries.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	nc, err := nats.Connect(nats.DefaultURL, nats.MaxReconnects(-1))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}

	lease, poll, maxBackoff := 30*time.Second, 5*time.Second, time.Minute
	need := natsink.WindowNeeded(lease, poll, maxBackoff) + time.Minute // and a minute of broker outage
	if err := natsink.CheckDuplicates(ctx, js, "PAYMENTS", need); err != nil {
		log.Fatal(err)
	}
	r := relay.New(pool, natsink.New(js, natsink.WithStream("PAYMENTS")),
		relay.WithClaimLease(lease), relay.WithPollInterval(poll), relay.WithBackoff(time.Second, maxBackoff))
	if err := r.Run(ctx); err != nil && ctx.Err() == nil {
		log.Fatal(err)
	}
}
