package idemnats_test

import (
	"context"
	"errors"
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

// printedMsg is a jetstream.Msg that prints the acknowledgements it is
// sent, in place of a server's message, so that the examples below run
// without a server.
type printedMsg struct {
	header    nats.Header
	data      string
	delivered uint64 // which delivery of the message this is, from 1
}

func (d printedMsg) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{Stream: "ORDERS", Consumer: "charger", NumDelivered: d.delivered}, nil
}
func (d printedMsg) Data() []byte                       { return []byte(d.data) }
func (d printedMsg) Headers() nats.Header               { return d.header }
func (d printedMsg) Subject() string                    { return "orders.placed" }
func (d printedMsg) Reply() string                      { return "" }
func (d printedMsg) Ack() error                         { return d.print("ack") }
func (d printedMsg) DoubleAck(context.Context) error    { return d.print("ack, confirmed") }
func (d printedMsg) Nak() error                         { return d.print("nak") }
func (d printedMsg) NakWithDelay(time.Duration) error   { return d.print("nak, after a backoff") }
func (d printedMsg) InProgress() error                  { return d.print("in progress") }
func (d printedMsg) Term() error                        { return d.print("term") }
func (d printedMsg) TermWithReason(reason string) error { return d.print("term: " + reason) }

func (d printedMsg) print(ack string) error {
	fmt.Printf("order %s %s, delivery %d: %s\n", d.header.Get("Order-Id"), d.data, d.delivered, ack)
	return nil
}

// A message delivered again (its ack was lost, or its AckWait passed)
// runs the handler once: the redelivery replays the stored result, and
// both are acked. A message that reuses the key with another body is
// termed, since no redelivery would change that, and its error says why.
func ExampleProcessor_Process_redelivery() {
	store := memstore.New()
	defer store.Close()
	charged := 0
	p := idemnats.NewProcessor(idempotency.NewRunner(store), "orders.charge",
		func(ctx context.Context, msg jetstream.Msg) (Receipt, error) {
			charged++
			return Receipt{ID: fmt.Sprint("ch_", charged), Amount: 1999}, nil
		},
		idemnats.WithKey(idemnats.HeaderKey("Order-Id")),
		// Process returns what it reports to the error handler: printed below.
		idemnats.WithErrorHandler(func(context.Context, jetstream.Msg, error) {}))

	order := nats.Header{"Order-Id": {"1001"}}
	for _, msg := range []printedMsg{
		{header: order, data: `{"amount":1999}`, delivered: 1},
		{header: order, data: `{"amount":1999}`, delivered: 2},
		{header: order, data: `{"amount":2999}`, delivered: 1},
	} {
		out, err := p.Process(context.Background(), msg)
		fmt.Println("  outcome:", out.Reason, "replayed:", out.Replayed, "error:", err)
	}
	fmt.Println("charged", charged, "time(s)")
	// Output:
	// order 1001 {"amount":1999}, delivery 1: ack, confirmed
	//   outcome: stored replayed: false error: <nil>
	// order 1001 {"amount":1999}, delivery 2: ack, confirmed
	//   outcome: replayed replayed: true error: <nil>
	// order 1001 {"amount":2999}, delivery 1: term
	//   outcome: mismatch replayed: false error: idemnats: term: idempotency: key used with a different call
	// charged 1 time(s)
}

// On the consumer's last delivery of a message (MaxDeliver 5: its 5th), a
// handler that fails gets the message termed rather than naked, since the
// server would not deliver it again, and the error, which wraps
// ErrLastDelivery, goes to the error handler: dead-letter the message
// there.
func ExampleWithMaxDeliver() {
	store := memstore.New()
	defer store.Close()
	p := idemnats.NewProcessor(idempotency.NewRunner(store), "orders.charge",
		func(context.Context, jetstream.Msg) (Receipt, error) {
			return Receipt{}, errors.New("card service down")
		},
		idemnats.WithKey(idemnats.HeaderKey("Order-Id")),
		idemnats.WithMaxDeliver(5),
		idemnats.WithErrorHandler(func(ctx context.Context, msg jetstream.Msg, err error) {
			if errors.Is(err, idemnats.ErrLastDelivery) {
				fmt.Println("dead-letter order", msg.Headers().Get("Order-Id")+":", err)
			}
		}))

	msg := printedMsg{header: nats.Header{"Order-Id": {"1002"}}, data: `{"amount":500}`, delivered: 5}
	out, _ := p.Process(context.Background(), msg)
	fmt.Println(out.Action, "last delivery:", out.LastDelivery)
	// Output:
	// order 1002 {"amount":500}, delivery 5: term
	// dead-letter order 1002: idemnats: term: last delivery (5 of 5): released: card service down
	// term last delivery: true
}
