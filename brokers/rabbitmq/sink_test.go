package idemrabbit_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	idemrabbit "github.com/go-idempotency/idempotency/brokers/rabbitmq"
	"github.com/go-idempotency/idempotency/brokers/rabbitmq/rabbittest"
	"github.com/go-idempotency/idempotency/outbox"
)

// TestMain stops the private RabbitMQ node that TestBrokerStopped starts.
func TestMain(m *testing.M) { os.Exit(rabbittest.Main(m)) }

func newSink(t testing.TB, opts ...idemrabbit.SinkOption) *idemrabbit.Sink {
	t.Helper()
	return newSinkOn(t, rabbittest.URL(t), opts...)
}

// newSinkOn returns a sink publishing to the broker at url, closed when t
// ends.
func newSinkOn(t testing.TB, url string, opts ...idemrabbit.SinkOption) *idemrabbit.Sink {
	t.Helper()
	s := idemrabbit.NewSink(url, opts...)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func envelope(id, topic, payload string) outbox.Envelope {
	return outbox.Envelope{ID: id, Topic: topic, Payload: []byte(payload), Attempt: 1, EnqueuedAt: time.Now().Truncate(time.Second)}
}

// consume returns the deliveries of queue to a consumer of its own, with
// manual acks, on a channel of its own.
func consume(t testing.TB, queue string) <-chan amqp.Delivery {
	t.Helper()
	return consumeOn(t, rabbittest.Channel(t), queue)
}

// consumeOn is consume on the channel ch.
func consumeOn(t testing.TB, ch *amqp.Channel, queue string) <-chan amqp.Delivery {
	t.Helper()
	ds, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return ds
}

// next returns the next delivery of ds, failing t when none comes within
// 10s.
func next(t testing.TB, ds <-chan amqp.Delivery) amqp.Delivery {
	t.Helper()
	select {
	case d, ok := <-ds:
		if !ok {
			t.Fatal("the consumer's channel closed")
		}
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery within 10s")
	}
	panic("unreachable")
}

// TestPublish: the message reaches the queue its topic names, persistent,
// with its ID as message_id, its payload, headers and enqueue time.
func TestPublish(t *testing.T) {
	queue := rabbittest.Queue(t)
	sink := newSink(t)
	e := envelope("k1/1", queue, `{"amount":1999}`)
	e.Headers = map[string]string{"Payment-Id": "pay_7"}
	if err := sink.Publish(context.Background(), e); err != nil {
		t.Fatal(err)
	}
	d := next(t, consume(t, queue))
	if d.MessageId != "k1/1" || string(d.Body) != string(e.Payload) || d.DeliveryMode != amqp.Persistent {
		t.Fatalf("got message_id %q, body %q, delivery mode %d", d.MessageId, d.Body, d.DeliveryMode)
	}
	if d.Headers["Payment-Id"] != "pay_7" || !d.Timestamp.Equal(e.EnqueuedAt) {
		t.Fatalf("got headers %v, timestamp %v; want Payment-Id pay_7, %v", d.Headers, d.Timestamp, e.EnqueuedAt)
	}
}

// TestUnroutable: a message no queue takes is returned, not dropped, and
// Publish says so; the sink goes on publishing.
func TestUnroutable(t *testing.T) {
	queue := rabbittest.Queue(t)
	sink := newSink(t, idemrabbit.WithChannels(1))
	err := sink.Publish(context.Background(), envelope("k2/1", queue+".nobody", "p"))
	if !errors.Is(err, idemrabbit.ErrUnroutable) {
		t.Fatalf("to no queue: %v", err)
	}
	if err := sink.Publish(context.Background(), envelope("k2/2", queue, "p")); err != nil {
		t.Fatal(err)
	}
	if d := next(t, consume(t, queue)); d.MessageId != "k2/2" {
		t.Fatalf("got %q, want k2/2", d.MessageId)
	}
}

// TestNoSuchExchange: the broker closes the channel of a publication to
// an exchange that does not exist; Publish reports it, and the next
// Publish opens another channel.
func TestNoSuchExchange(t *testing.T) {
	sink := newSink(t, idemrabbit.WithExchange("idemtest.no-such-exchange"), idemrabbit.WithChannels(1))
	for i := range 2 {
		err := sink.Publish(context.Background(), envelope(fmt.Sprint("k3/", i), "q", "p"))
		if !errors.Is(err, idemrabbit.ErrNacked) {
			t.Fatalf("publication %d: %v", i, err)
		}
	}
}

// TestConcurrentPublish: publications from many goroutines share the
// sink's channels; every one is confirmed and in the queue.
func TestConcurrentPublish(t *testing.T) {
	queue := rabbittest.Queue(t)
	sink := newSink(t, idemrabbit.WithChannels(3))
	const n = 300
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for g := range 10 {
		wg.Go(func() {
			for i := g; i < n; i += 10 {
				if err := sink.Publish(context.Background(), envelope(fmt.Sprint("k4/", i), queue, "p")); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	ds := consume(t, queue)
	seen := map[string]bool{}
	for range n {
		d := next(t, ds)
		seen[d.MessageId] = true
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
	}
	if len(seen) != n {
		t.Fatalf("%d distinct messages, want %d", len(seen), n)
	}
}

// TestBrokerStopped: while the broker is stopped Publish fails within its
// timeout; once it is back the sink dials again, and the messages
// confirmed before the stop are still in the queue. The broker stopped is
// the test binary's private node, never the machine's.
func TestBrokerStopped(t *testing.T) {
	broker := rabbittest.PrivateNode(t)
	queue := broker.Queue(t)
	sink := newSinkOn(t, broker.URL(), idemrabbit.WithTimeout(2*time.Second))
	if err := sink.Publish(context.Background(), envelope("k5/1", queue, "p")); err != nil {
		t.Fatal(err)
	}
	if err := broker.Stop(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := sink.Publish(context.Background(), envelope("k5/2", queue, "p")); err == nil {
		t.Fatal("published with the broker stopped")
	} else if d := time.Since(start); d > 4*time.Second {
		t.Fatalf("failed after %v, past the 2s timeout: %v", d, err)
	}
	if err := broker.Start(); err != nil {
		t.Fatal(err)
	}
	if err := sink.Publish(context.Background(), envelope("k5/3", queue, "p")); err != nil {
		t.Fatal(err)
	}
	ds := consumeOn(t, broker.Channel(t), queue)
	for _, want := range []string{"k5/1", "k5/3"} {
		if d := next(t, ds); d.MessageId != want {
			t.Fatalf("got %q, want %s", d.MessageId, want)
		}
	}
}

// TestClosed: Publish after Close fails with ErrClosed.
func TestClosed(t *testing.T) {
	queue := rabbittest.Queue(t)
	sink := newSink(t)
	if err := sink.Publish(context.Background(), envelope("k6/1", queue, "p")); err != nil {
		t.Fatal(err)
	}
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	if err := sink.Publish(context.Background(), envelope("k6/2", queue, "p")); !errors.Is(err, idemrabbit.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

func TestMisconfigurationPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"NewSink(bad URL)":   func() { idemrabbit.NewSink("http://127.0.0.1/") },
		"WithRoutingKey":     func() { idemrabbit.WithRoutingKey(nil) },
		"WithChannels(0)":    func() { idemrabbit.WithChannels(0) },
		"WithTimeout(0)":     func() { idemrabbit.WithTimeout(0) },
		"NewSink(no scheme)": func() { idemrabbit.NewSink("127.0.0.1:5672") },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			f()
		})
	}
}
