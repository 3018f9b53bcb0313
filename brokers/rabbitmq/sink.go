package idemrabbit

import (
	"context"
	"errors"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/go-idempotency/idempotency/outbox"
)

// Errors of the sink. Each means the message may or may not have been
// published; the relay publishes it again later, under the same ID.
var (
	// ErrNacked is wrapped by the error of Publish when the broker
	// refused the message (a negative confirm), or the channel closed
	// before the broker confirmed it.
	ErrNacked = errors.New("idemrabbit: the broker did not confirm the message")
	// ErrUnroutable is wrapped by the error of Publish when the exchange
	// routed the message to no queue: it is published mandatory, so the
	// broker returned it instead of dropping it.
	ErrUnroutable = errors.New("idemrabbit: the message was routed to no queue")
	// ErrClosed is returned by Publish after Close.
	ErrClosed = errors.New("idemrabbit: sink closed")
)

// Sink publishes outbox messages to RabbitMQ with publisher confirms: it
// is the outbox.Sink of a relay (outbox/relay) that publishes to RabbitMQ.
// Each message is persistent and mandatory, carries its ID
// (outbox.Envelope.ID, stable across the relay's retries) as its
// message_id, and Publish returns nil only once the broker confirmed it
// (for a durable queue: once the queue has it on disk). Delivery is at
// least once: the relay publishes a message again when it cannot know
// whether the broker took it, and RabbitMQ keeps both, so consumers
// deduplicate on message_id (Process).
//
// The Sink dials the broker when it first publishes and again after the
// connection closed; it publishes on up to WithChannels channels at once,
// each with one message in flight for Publish, or a window of them for
// PublishBatch (the Sink is an outbox.BatchSink too). It is safe for
// concurrent use.
type Sink struct {
	url   string
	cfg   sinkConfig
	slots chan struct{}     // a value per channel in use
	idle  chan *confirmedCh // channels free to publish on

	mu     sync.Mutex       // guards conn and closed
	conn   *amqp.Connection // nil before the first dial
	closed bool
}

var _ outbox.Sink = (*Sink)(nil)

// confirmedCh is a channel in confirm mode with its listeners.
type confirmedCh struct {
	ch      *amqp.Channel
	returns chan amqp.Return // holds the returns of the messages in flight, if any
	closes  chan *amqp.Error // holds the reason the channel closed, if it did
}

// NewSink returns a Sink publishing to the broker at url
// ("amqp://guest:guest@127.0.0.1:5672/"). It does not connect until the
// first Publish. NewSink panics when url is not an AMQP URI.
func NewSink(url string, opts ...SinkOption) *Sink {
	if _, err := amqp.ParseURI(url); err != nil {
		panic("idemrabbit: NewSink: " + err.Error())
	}
	cfg := newSinkConfig(opts)
	return &Sink{
		url:   url,
		cfg:   cfg,
		slots: make(chan struct{}, cfg.channels),
		idle:  make(chan *confirmedCh, cfg.channels),
	}
}

// Publish publishes e to the exchange (WithExchange) with its routing key
// (WithRoutingKey: by default its Topic), and returns nil once the broker
// confirmed it. Any error means that e may or may not have been
// published.
func (s *Sink) Publish(ctx context.Context, e outbox.Envelope) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.timeout)
	defer cancel()
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("idemrabbit: publishing %s: %w", e.ID, context.Cause(ctx))
	}
	defer func() { <-s.slots }()

	c, err := s.channel()
	if err != nil {
		return fmt.Errorf("idemrabbit: publishing %s: %w", e.ID, err)
	}
	key := s.cfg.routingKey(e)
	dc, err := c.ch.PublishWithDeferredConfirmWithContext(ctx, s.cfg.exchange, key, true, false, publishing(e))
	if err != nil {
		s.discard(c)
		return fmt.Errorf("idemrabbit: publishing %s: %w", e.ID, err)
	}
	acked, err := dc.WaitContext(ctx)
	if err != nil { // the confirm may still come: this channel is done
		s.discard(c)
		return fmt.Errorf("idemrabbit: publishing %s: waiting for the confirm: %w", e.ID, err)
	}
	if !acked {
		select {
		case reason := <-c.closes:
			s.discard(c)
			return fmt.Errorf("%w: %s: the channel closed: %v", ErrNacked, e.ID, reason)
		default:
		}
		if c.ch.IsClosed() {
			s.discard(c)
			return fmt.Errorf("%w: %s: the channel closed", ErrNacked, e.ID)
		}
		s.idle <- c
		return fmt.Errorf("%w: %s", ErrNacked, e.ID)
	}
	// The broker sends a mandatory message's return before its confirm,
	// and the client hands it to c.returns before it reads the confirm.
	select {
	case r, ok := <-c.returns:
		if !ok { // closed with the channel, after the confirm
			s.discard(c)
			return nil
		}
		s.idle <- c
		return fmt.Errorf("%w: %s to exchange %q with routing key %q: %d %s", ErrUnroutable, r.MessageId, r.Exchange, r.RoutingKey, r.ReplyCode, r.ReplyText)
	default:
	}
	s.idle <- c
	return nil
}

// publishing is the AMQP message of e.
func publishing(e outbox.Envelope) amqp.Publishing {
	p := amqp.Publishing{
		MessageId:    e.ID,
		DeliveryMode: amqp.Persistent,
		Timestamp:    e.EnqueuedAt,
		Body:         e.Payload,
	}
	if len(e.Headers) > 0 {
		p.Headers = make(amqp.Table, len(e.Headers))
		for k, v := range e.Headers {
			p.Headers[k] = v
		}
	}
	return p
}

// channel returns an idle channel that is still open, or opens one (on a
// connection dialled anew if the last one closed).
func (s *Sink) channel() (*confirmedCh, error) {
	for {
		select {
		case c := <-s.idle:
			if !c.ch.IsClosed() {
				return c, nil
			}
		default:
			return s.open()
		}
	}
}

func (s *Sink) open() (*confirmedCh, error) {
	conn, err := s.connection()
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("opening a channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("confirm mode: %w", err)
	}
	// The client hands returns over from the goroutine that reads the
	// connection: a full buffer would stall every channel of the
	// connection. PublishBatch has at most a window of messages in
	// flight, and takes their returns as their confirms come.
	return &confirmedCh{
		ch:      ch,
		returns: ch.NotifyReturn(make(chan amqp.Return, DefaultWindow)),
		closes:  ch.NotifyClose(make(chan *amqp.Error, 1)),
	}, nil
}

// connection returns the live connection, dialling when there is none.
func (s *Sink) connection() (*amqp.Connection, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if s.conn != nil && !s.conn.IsClosed() {
		return s.conn, nil
	}
	conn, err := amqp.DialConfig(s.url, s.cfg.amqp)
	if err != nil {
		return nil, fmt.Errorf("dialling the broker: %w", err)
	}
	s.conn = conn
	return conn, nil
}

// discard closes c, whose state is unknown, in the background: a broker
// that does not answer would hold the close.
func (s *Sink) discard(c *confirmedCh) {
	go func() { _ = c.ch.Close() }()
}

// Close closes the connection; Publish returns ErrClosed afterwards.
func (s *Sink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.conn == nil || s.conn.IsClosed() {
		return nil
	}
	return s.conn.Close()
}
