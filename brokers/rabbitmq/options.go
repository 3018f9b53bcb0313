package idemrabbit

import (
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/go-idempotency/idempotency/outbox"
)

// Defaults of the Sink.
const (
	// DefaultTimeout bounds each publication, from the dial it may need to
	// the broker's confirm.
	DefaultTimeout = 5 * time.Second
	// DefaultChannels is how many channels a Sink publishes on at once.
	DefaultChannels = 4
)

// SinkOption configures a Sink.
type SinkOption func(*sinkConfig)

type sinkConfig struct {
	exchange   string
	routingKey func(outbox.Envelope) string
	channels   int
	timeout    time.Duration
	amqp       amqp.Config
}

func newSinkConfig(opts []SinkOption) sinkConfig {
	c := sinkConfig{
		routingKey: func(e outbox.Envelope) string { return e.Topic },
		channels:   DefaultChannels,
		timeout:    DefaultTimeout,
	}
	for _, o := range opts {
		o(&c)
	}
	if c.amqp.Dial == nil {
		c.amqp.Dial = amqp.DefaultDial(c.timeout)
	}
	c.amqp.Recovery = nil // the Sink dials again itself
	return c
}

// WithExchange sets the exchange the Sink publishes to. With the default
// exchange, the routing key is the name of the queue that gets the
// message.
// Default: "" (the default exchange).
func WithExchange(name string) SinkOption {
	return func(c *sinkConfig) { c.exchange = name }
}

// WithRoutingKey sets the function that gives a message's routing key. It
// panics if f is nil.
// Default: the message's Topic.
func WithRoutingKey(f func(outbox.Envelope) string) SinkOption {
	if f == nil {
		panic("idemrabbit: WithRoutingKey needs a function")
	}
	return func(c *sinkConfig) { c.routingKey = f }
}

// WithChannels sets how many channels the Sink publishes on at once, each
// with one message in flight: the most Publish calls that run together
// (the others wait for a channel). It panics if n is below 1.
// Default: 4 (DefaultChannels).
func WithChannels(n int) SinkOption {
	if n < 1 {
		panic("idemrabbit: WithChannels needs at least one channel")
	}
	return func(c *sinkConfig) { c.channels = n }
}

// WithTimeout bounds each publication within the caller's context: the
// wait for a channel, the dial it may need, and the broker's confirm. It
// panics if d is not positive.
// Default: 5s (DefaultTimeout).
func WithTimeout(d time.Duration) SinkOption {
	if d <= 0 {
		panic("idemrabbit: WithTimeout needs a positive duration")
	}
	return func(c *sinkConfig) { c.timeout = d }
}

// WithConfig sets the configuration of the Sink's connections (TLS,
// credentials, heartbeat, vhost: see amqp.Config). Its Dial, when nil,
// dials with the Sink's timeout; its Recovery is not used, as the Sink
// dials again itself after a connection closed.
// Default: amqp091-go's, from the URL (a heartbeat every 10s).
func WithConfig(cfg amqp.Config) SinkOption {
	return func(c *sinkConfig) { c.amqp = cfg }
}
