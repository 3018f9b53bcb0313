package natsink

import (
	"time"

	"github.com/go-idempotency/idempotency/outbox"
)

// DefaultTimeout bounds each publication when the caller's context has no
// sooner deadline.
const DefaultTimeout = 5 * time.Second

// Option configures a Sink.
type Option func(*config)

type config struct {
	subject func(outbox.Envelope) string
	stream  string
	timeout time.Duration
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
