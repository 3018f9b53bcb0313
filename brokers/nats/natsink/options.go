package natsink

import (
	"time"

	"github.com/go-idempotency/idempotency/outbox"
)

// Defaults of the Sink.
const (
	// DefaultTimeout bounds each publication when the caller's context has
	// no sooner deadline.
	DefaultTimeout = 5 * time.Second
	// DefaultWindow is how many publications PublishBatch keeps waiting
	// for their acks at once.
	DefaultWindow = 256
)

// Option configures a Sink.
type Option func(*config)

type config struct {
	subject func(outbox.Envelope) string
	stream  string
	timeout time.Duration
	window  int
}

// WithSubject sets the function that gives a message's subject. It panics
// if f is nil.
// Default: the message's Topic.
func WithSubject(f func(outbox.Envelope) string) Option {
	if f == nil {
		panic("natsink: WithSubject needs a function")
	}
	return func(c *config) { c.subject = f }
}

// WithStream makes every publication expect the stream named (the
// Nats-Expected-Stream header): a subject that no stream, or another
// stream, captures is refused with an error, and the relay retries it,
// rather than stored where nobody dedupes or reads it. It panics if name
// is empty.
// Default: any stream that captures the subject.
func WithStream(name string) Option {
	if name == "" {
		panic("natsink: WithStream needs a stream name")
	}
	return func(c *config) { c.stream = name }
}

// WithTimeout bounds each publication, from its send to the stream's ack,
// within the caller's context. It panics if d is not positive.
// Default: 5s (DefaultTimeout).
func WithTimeout(d time.Duration) Option {
	if d <= 0 {
		panic("natsink: WithTimeout needs a positive duration")
	}
	return func(c *config) { c.timeout = d }
}

// WithWindow sets how many publications PublishBatch keeps waiting for
// their acks at once: it sends the next message of a batch only while
// fewer than n are. A larger window keeps the stream busier over a link
// with more latency, at the cost of more messages in flight when the
// connection drops (their errors make the relay publish them again). The
// JetStream context's own cap on pending asynchronous publications
// (jetstream.WithPublishAsyncMaxPending, 4,000 by default) bounds the sum
// over the batches published on it at once. It panics if n is below 1.
// Default: 256 (DefaultWindow).
func WithWindow(n int) Option {
	if n < 1 {
		panic("natsink: WithWindow needs a window of at least 1")
	}
	return func(c *config) { c.window = n }
}
