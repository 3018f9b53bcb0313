package idemrabbit

import (
	"context"
	"log/slog"
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

// Defaults of the Processor.
const (
	// DefaultBackoffBase is how long a failed first delivery is held
	// before it is requeued.
	DefaultBackoffBase = time.Second
	// DefaultBackoffCap is the longest a failed delivery is held before it
	// is requeued.
	DefaultBackoffCap = time.Minute
)

// ProcessorOption configures a Processor.
type ProcessorOption func(*processorConfig)

type processorConfig struct {
	backoffBase, backoffCap time.Duration
	limit                   int // x-delivery-limit; noLimit when unknown
	onError                 func(ctx context.Context, d amqp.Delivery, err error)
}

// noLimit is the limit of a queue whose delivery limit the Processor was
// not told.
const noLimit = -1

func newProcessorConfig(opts []ProcessorOption) processorConfig {
	c := processorConfig{
		backoffBase: DefaultBackoffBase,
		backoffCap:  DefaultBackoffCap,
		limit:       noLimit,
		onError:     logError,
	}
	for _, o := range opts {
		if o == nil {
			panic("idemrabbit: NewProcessor: nil ProcessorOption")
		}
		o(&c)
	}
	return c
}

// last reports whether the n-th delivery of a message is the last one the
// queue makes: with x-delivery-limit L, a quorum queue delivers a message
// L+1 times, and drops (or dead-letters) it when the last is returned.
func (c *processorConfig) last(n int) bool {
	return c.limit != noLimit && n > c.limit
}

// WithBackoff sets the backoff of a delivery whose handler failed (or
// whose store could not be used): Process holds it, unacked, for base
// doubled for each earlier delivery of the message, up to ceiling, jittered
// within the upper half of that, and then requeues it. The count of
// earlier deliveries is the x-delivery-count header a quorum queue sets;
// a classic queue only says whether the message was redelivered, so there
// the backoff stays at its second step. Keep ceiling well under the broker's
// consumer_timeout (30 minutes by default). It panics unless
// 0 < base <= ceiling.
// Default: 1s (DefaultBackoffBase) doubling up to 1m (DefaultBackoffCap).
func WithBackoff(base, ceiling time.Duration) ProcessorOption {
	if base <= 0 || ceiling < base {
		panic("idemrabbit: WithBackoff needs 0 < base <= ceiling")
	}
	return func(c *processorConfig) { c.backoffBase, c.backoffCap = base, ceiling }
}

// WithDeliveryLimit tells the Processor the delivery limit of its queue
// (the x-delivery-limit argument or delivery-limit policy of a quorum
// queue; 20 by default on RabbitMQ 4): the queue delivers a message n+1
// times at most. A delivery that has reached the limit (its
// x-delivery-count is n) and whose outcome would requeue it is rejected
// without requeue instead, so that the queue dead-letters it, and its
// error, which wraps ErrLastDelivery and the reason, goes to the error
// handler: the application learns that the message will not come back.
// It panics if n is negative.
// Default: none (the Processor assumes no limit).
func WithDeliveryLimit(n int) ProcessorOption {
	if n < 0 {
		panic("idemrabbit: WithDeliveryLimit needs a non-negative limit")
	}
	return func(c *processorConfig) { c.limit = n }
}

// WithErrorHandler sets the function that receives every error Process
// returns, with the delivery: a handler's failure, a record that could
// not be stored, a rejection, a last delivery (ErrLastDelivery), and what
// settling the delivery met. It may be called from several goroutines at
// once.
// Default: a Warn record on slog.Default().
func WithErrorHandler(h func(ctx context.Context, d amqp.Delivery, err error)) ProcessorOption {
	if h == nil {
		panic("idemrabbit: WithErrorHandler needs a function")
	}
	return func(c *processorConfig) { c.onError = h }
}

// logError is the default error handler.
func logError(ctx context.Context, d amqp.Delivery, err error) {
	slog.Default().WarnContext(ctx, "idemrabbit: delivery handling failed", "err", err,
		"message_id", d.MessageId, "routing_key", d.RoutingKey, "delivery", deliveryNumber(d))
}
