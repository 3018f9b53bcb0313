package idemnats_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/go-idempotency/idempotency/brokers/nats/natstest"
)

// natsURL returns the URL of a JetStream server for t (see natstest).
func natsURL(t testing.TB) string {
	t.Helper()
	return natstest.URL(t)
}

// connect returns a JetStream context on a connection to url, closed when
// t ends.
func connect(t testing.TB, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	return natstest.Connect(t, url)
}

// stream is a stream of its own for a test, deleted when the test ends.
type stream struct {
	name, subject string
	js            jetstream.JetStream
}

// newStream creates a stream under a random name, with a subject of its
// own, deleted when t ends.
func newStream(t testing.TB, js jetstream.JetStream) *stream {
	t.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	id := hex.EncodeToString(b[:])
	s := &stream{name: "IDEMTEST_" + strings.ToUpper(id), subject: "idemtest." + id, js: js}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: s.name, Subjects: []string{s.subject}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), s.name) })
	return s
}

// consumer creates a durable pull consumer of the stream with explicit
// acks and the AckWait given.
func (s *stream) consumer(t testing.TB, name string, ackWait time.Duration) jetstream.Consumer {
	t.Helper()
	c, err := s.js.CreateOrUpdateConsumer(context.Background(), s.name, jetstream.ConsumerConfig{
		Durable:       name,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		MaxAckPending: 10_000,
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// publish publishes data with the headers given (name, value pairs) and
// waits for the stream's ack.
func (s *stream) publish(t testing.TB, data string, headers ...string) {
	t.Helper()
	m := nats.NewMsg(s.subject)
	m.Data = []byte(data)
	for i := 0; i+1 < len(headers); i += 2 {
		m.Header.Set(headers[i], headers[i+1])
	}
	if _, err := s.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}
