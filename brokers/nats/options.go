package idemnats

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Option configures a Processor.
type Option func(*config)

type config struct {
	key      func(jetstream.Msg) (string, error)
	scope    func(jetstream.Msg) string
	payload  func(jetstream.Msg) []byte
	ackWait  time.Duration
	nakDelay time.Duration
	onError  func(ctx context.Context, msg jetstream.Msg, err error)
}

// DefaultAckWait is JetStream's default AckWait, which Process assumes
// unless WithAckWait says otherwise.
const DefaultAckWait = 30 * time.Second

// DefaultNakDelay is the delay of a nak unless WithNakDelay says otherwise.
const DefaultNakDelay = time.Second

func newConfig(opts []Option) config {
	cfg := config{
		key:      DefaultKey,
		scope:    func(jetstream.Msg) string { return "" },
		payload:  func(msg jetstream.Msg) []byte { return msg.Data() },
		ackWait:  DefaultAckWait,
		nakDelay: DefaultNakDelay,
		onError:  logError,
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
// Default: DefaultKey (the Nats-Msg-Id header, else the stream and stream
// sequence).
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
// while Do waits for another holder of the key), and bounds the wait for
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

// WithNakDelay sets the delay of the naks sent when the handler failed or
// the store could not be used: the time before the server redelivers the
// message. 0 naks without a delay (an immediate redelivery, or the
// consumer's BackOff). A message naked while another consumer holds its
// key is delayed by that holder's lease instead. It panics if d is
// negative.
// Default: 1s (DefaultNakDelay).
func WithNakDelay(d time.Duration) Option {
	if d < 0 {
		panic("idemnats: WithNakDelay needs a non-negative duration")
	}
	return func(c *config) { c.nakDelay = d }
}

// WithErrorHandler sets the function that receives the errors of Process
// and Consume: every error Process returns except an
// *idempotency.InFlightError (another consumer holds the key: the message
// comes back), and the errors of consumption that jetstream reports, with
// a nil msg. It may be called from several goroutines at once.
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
