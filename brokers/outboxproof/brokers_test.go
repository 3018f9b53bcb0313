package outboxproof_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/go-idempotency/idempotency/brokers/nats/natsink"
	"github.com/go-idempotency/idempotency/brokers/nats/natstest"
	idemrabbit "github.com/go-idempotency/idempotency/brokers/rabbitmq"
	"github.com/go-idempotency/idempotency/brokers/rabbitmq/rabbittest"
	"github.com/go-idempotency/idempotency/outbox"
)

// TestMain stops the private RabbitMQ node that the RabbitMQ proof's
// broker outage starts.
func TestMain(m *testing.M) { os.Exit(rabbittest.Main(m)) }

// TestNATS runs the proof's scenarios on JetStream: every committed
// message is in the stream exactly once.
func TestNATS(t *testing.T) {
	for _, sc := range scenarios {
		t.Run(string(sc), func(t *testing.T) { prove(t, natsBroker(t), sc) })
	}
}

// TestRabbitMQ runs the proof's scenarios on RabbitMQ: every committed
// message is in the queue at least once.
func TestRabbitMQ(t *testing.T) {
	for _, sc := range scenarios {
		t.Run(string(sc), func(t *testing.T) { prove(t, rabbitBroker(t, sc == brokerStopped), sc) })
	}
}

func randomID(t testing.TB) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// natsBroker is a private nats-server with a stream of the proof's own
// (its Duplicates window JetStream's default, 2 minutes).
func natsBroker(t *testing.T) *broker {
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv.URL)
	id := randomID(t)
	stream, subject := "PROOF_"+strings.ToUpper(id), "proof."+id+".payment"
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: stream, Subjects: []string{subject}}); err != nil {
		t.Fatal(err)
	}
	return &broker{
		name:        "JetStream",
		exactlyOnce: true,
		env:         []string{childBroker + "=nats", childURL + "=" + srv.URL, childStream + "=" + stream},
		topic:       subject,
		stop:        func() error { srv.Stop(); return nil },
		start:       srv.Restart,
		contents: func(t *testing.T) map[string][]string {
			_, js := natstest.Connect(t, srv.URL)
			st, err := js.Stream(context.Background(), stream)
			if err != nil {
				t.Fatal(err)
			}
			n := st.CachedInfo().State.Msgs
			cons, err := st.OrderedConsumer(context.Background(), jetstream.OrderedConsumerConfig{})
			if err != nil {
				t.Fatal(err)
			}
			got := map[string][]string{}
			for range n {
				msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
				if err != nil {
					t.Fatal(err)
				}
				id := msg.Headers().Get(jetstream.MsgIDHeader)
				got[id] = append(got[id], string(msg.Data()))
			}
			return got
		},
	}
}

// rabbitBroker is the broker at RABBITMQ_URL or on 127.0.0.1:5672 with a
// queue of the proof's own; with stoppable, it is the test binary's
// private node instead (rabbittest.PrivateNode), whose application is
// stopped and started: no test stops a broker it did not start.
func rabbitBroker(t *testing.T, stoppable bool) *broker {
	var (
		url, queue string
		channel    func(testing.TB) *amqp.Channel
		node       *rabbittest.Node
	)
	if stoppable {
		node = rabbittest.PrivateNode(t)
		url, queue, channel = node.URL(), node.Queue(t), node.Channel
	} else {
		url, queue, channel = rabbittest.URL(t), rabbittest.Queue(t), rabbittest.Channel
	}
	b := &broker{
		name:  "RabbitMQ",
		env:   []string{childBroker + "=rabbitmq", childURL + "=" + url},
		topic: queue,
		contents: func(t *testing.T) map[string][]string {
			ch := channel(t)
			n := rabbittest.Messages(t, ch, queue)
			ds, err := ch.Consume(queue, "", false, false, false, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string][]string{}
			for range n {
				select {
				case d := <-ds:
					got[d.MessageId] = append(got[d.MessageId], string(d.Body))
					if err := d.Ack(false); err != nil {
						t.Fatal(err)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("%d of %d messages read from %s", len(got), n, queue)
				}
			}
			return got
		},
	}
	if node != nil {
		b.stop, b.start = node.Stop, node.Start
	}
	return b
}

// brokerSink returns the publication of the relay process's broker, which
// reports whether the broker had the message already (JetStream only).
func brokerSink(t *testing.T, kind string) func(context.Context, outbox.Envelope) (duplicate bool, err error) {
	url := os.Getenv(childURL)
	switch kind {
	case "nats":
		nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		sink := natsink.New(js, natsink.WithStream(os.Getenv(childStream)))
		return func(ctx context.Context, e outbox.Envelope) (bool, error) {
			ack, err := sink.PublishAck(ctx, e)
			return err == nil && ack.Duplicate, err
		}
	case "rabbitmq":
		sink := idemrabbit.NewSink(url, idemrabbit.WithConfig(amqp.Config{Heartbeat: time.Second}))
		t.Cleanup(func() { _ = sink.Close() })
		return func(ctx context.Context, e outbox.Envelope) (bool, error) {
			return false, sink.Publish(ctx, e)
		}
	}
	t.Fatalf("%s=%q", childBroker, kind)
	return nil
}
