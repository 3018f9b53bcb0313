package idemnats

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Option configures a Processor.
type Option func(*config)

type config struct {
	key         func(jetstream.Msg) (string, error)
	scope       func(jetstream.Msg) string
	payload     func(jetstream.Msg) []byte
	ackWait     time.Duration
	nakDelay    time.Duration
	maxNakDelay time.Duration
	maxDeliver  int
	conn        *nats.Conn
	onError     func(ctx context.Context, msg jetstream.Msg, err error)
}

// DefaultAckWait is JetStream's default AckWait, which Process assumes
// unless WithAckWait says otherwise.
const DefaultAckWait = 30 * time.Second

// DefaultNakDelay is the base of the naks' backoff unless WithNakDelay
// says otherwise.
const DefaultNakDelay = time.Second

// DefaultMaxNakDelay is the longest delay of a nak unless WithMaxNakDelay
// says otherwise.
const DefaultMaxNakDelay = 5 * time.Minute

func newConfig(opts []Option) config {
	cfg := config{
		key:         DefaultKey,
		scope:       func(jetstream.Msg) string { return "" },
		payload:     func(msg jetstream.Msg) []byte { return msg.Data() },
		ackWait:     DefaultAckWait,
		nakDelay:    DefaultNakDelay,
		maxNakDelay: DefaultMaxNakDelay,
		maxDeliver:  -1,
		onError:     logError,
	}
	for _, o := range opts {
		if o == nil {
			panic("idemnats: NewProcessor: nil Option")
		}
		o(&cfg)
	}
	return cfg
}

// WithKey sets the function that takes a message's idempotency key: a
// business key (an order ID in a header or in the body) makes two
// publications of the same request one execution, whatever their message
// IDs. A message for which it returns an error, an empty key or a key over
// idempotency.MaxKeyLen bytes is termed and reported: redelivering it
// cannot give it a key. See also HeaderKey.
// Default: DefaultKey (the Nats-Msg-Id header, else the stream, stream
// sequence and stored timestamp).
func WithKey(key func(msg jetstream.Msg) (string, error)) Option {
	if key == nil {
		panic("idemnats: WithKey needs a function")
	}
	return func(c *config) { c.key = key }
}

// WithScope sets the function that takes the principal owning a message's
// key (a tenant, an account): keys of different scopes never meet.
// Default: "" for every message.
func WithScope(scope func(msg jetstream.Msg) string) Option {
	if scope == nil {
		panic("idemnats: WithScope needs a function")
	}
	return func(c *config) { c.scope = scope }
}

// WithPayload sets the function that takes what a message is about, whose
// SHA-256 is its fingerprint: a message with a known key and another
// payload is termed (idempotency.ErrFingerprintMismatch). Fingerprint the
// business fields only when publishers add varying ones (a timestamp, a
// trace ID) to the body.
// Default: msg.Data().
func WithPayload(payload func(msg jetstream.Msg) []byte) Option {
	if payload == nil {
		panic("idemnats: WithPayload needs a function")
	}
	return func(c *config) { c.payload = payload }
}

// WithAckWait sets the AckWait that Process assumes for its messages: it
// sends an in-progress ack every third of it while the handler runs (and
// while it waits for another holder of the key), and bounds the wait for
// the ack's confirmation by a third of it. Set it to the consumer's
// AckWait (or, with BackOff, its shortest interval); Consume takes it from
// the consumer's configuration instead. It panics if d is not positive.
// Default: 30s (DefaultAckWait).
func WithAckWait(d time.Duration) Option {
	if d <= 0 {
		panic("idemnats: WithAckWait needs a positive duration")
	}
	return func(c *config) { c.ackWait = d }
}

// WithNakDelay sets the base of the naks' backoff: the delay of a nak on
// a message's first delivery, when the handler failed, the store could not
// be used or nothing was committed. Each later delivery's delay doubles, up
// to WithMaxNakDelay, and a random part of under half of each is taken
// off, so that messages that failed together come back apart. A nak is
// never sent without a delay: a failing message redelivered at once would
// spin. It panics if d is not positive.
// Default: 1s (DefaultNakDelay).
func WithNakDelay(d time.Duration) Option {
	if d <= 0 {
		panic("idemnats: WithNakDelay needs a positive duration")
	}
	return func(c *config) { c.nakDelay = d }
}

// WithMaxNakDelay sets the longest delay of a nak (see WithNakDelay): a
// message that keeps failing, on a consumer without a MaxDeliver, comes
// back at most this long after its last delivery. It panics if d is not
// positive.
// Default: 5m (DefaultMaxNakDelay).
func WithMaxNakDelay(d time.Duration) Option {
	if d <= 0 {
		panic("idemnats: WithMaxNakDelay needs a positive duration")
	}
	return func(c *config) { c.maxNakDelay = d }
}

// WithMaxDeliver sets the MaxDeliver that Process assumes for its
// messages' consumer: on a message's last delivery (NumDelivered at
// least n), a message that would be naked is termed instead and reported
// with an error wrapping ErrLastDelivery, since the server would not
// deliver it again. Set it to the consumer's MaxDeliver; Consume takes it
// from the consumer's configuration instead. n below 1 means unlimited, as
// JetStream's -1.
// Default: -1 (unlimited).
func WithMaxDeliver(n int) Option {
	return func(c *config) { c.maxDeliver = n }
}

// WithConn sets the connection the Processor's messages arrive on: when
// its server is nats-server 2.10.4 or later, a term carries its reason
// (TermWithReason: the outcome, in the server's advisory), which earlier
// servers ignore, leaving the message unterminated. The connected server's
// version is read at each term, so that a reconnection to another server
// is followed.
// Default: none (a plain Term, which every server honours).
func WithConn(nc *nats.Conn) Option {
	if nc == nil {
		panic("idemnats: WithConn needs a connection")
	}
	return func(c *config) { c.conn = nc }
}

// WithErrorHandler sets the function that receives the errors of Process
// and Consume: every error Process returns except that of a message
// naked because ctx ended (the consumer stops: the message comes back,
// unless that was its last delivery, which is reported), and the errors
// of consumption that jetstream reports, with a
// nil msg. An error wrapping ErrLastDelivery marks a message that nothing
// will retry: dead-letter it here. It may be called from several
// goroutines at once.
// Default: a Warn record on slog.Default().
func WithErrorHandler(h func(ctx context.Context, msg jetstream.Msg, err error)) Option {
	if h == nil {
		panic("idemnats: WithErrorHandler needs a function")
	}
	return func(c *config) { c.onError = h }
}

// logError is the default error handler.
func logError(ctx context.Context, msg jetstream.Msg, err error) {
	attrs := []any{"err", err}
	if msg != nil {
		attrs = append(attrs, "subject", msg.Subject())
		if meta, merr := msg.Metadata(); merr == nil {
			attrs = append(attrs, "stream", meta.Stream, "stream_seq", meta.Sequence.Stream, "delivered", meta.NumDelivered)
		}
	}
	slog.Default().WarnContext(ctx, "idemnats: message handling failed", attrs...)
}
