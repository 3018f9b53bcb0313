package outbox

import (
	"time"

	"github.com/go-idempotency/idempotency/outbox/lifecycle"
)

// Message is a message a handler enqueues. Enqueue checks it against the
// grammar below before it writes anything (see Validate), so that nothing
// reaches the table that no sink could publish.
//
//   - Topic: 1 to MaxTopicLen bytes of visible ASCII (from '!' to '~'),
//     without '*' or '>', and without an empty '.'-separated token (no
//     leading, trailing or doubled dot): what a NATS subject and a
//     RabbitMQ routing key both accept.
//   - Header names: 1 to MaxHeaderNameLen bytes of RFC 9110 token
//     characters (letters, digits and !#$%&'*+-.^_`|~).
//   - Header values: valid UTF-8, without CR, LF or NUL.
//   - Headers in all (names and values): at most MaxHeadersSize bytes.
//   - OrderingKey: at most MaxOrderingKeyLen bytes of valid UTF-8 without
//     NUL.
//   - Payload: at most MaxPayloadSize bytes, any bytes.
type Message struct {
	// Topic is the subject (NATS) or routing key (RabbitMQ). Required.
	Topic string
	// Payload is the message's body, published as it is.
	Payload []byte
	// Headers are copied; the relay passes them to the sink. Add the
	// request's trace context to them (adapters/otel's TraceHeaders(ctx))
	// to link the publish to the request: adapters/otel's Sink makes it a
	// span in the request's trace.
	Headers map[string]string
	// OrderingKey groups messages that are published in enqueue order
	// (a payment ID, an account). Default: the record's storage key, so
	// that the messages of one request are published in the order it
	// enqueued them.
	//
	// A message of a key is presented only once every earlier message of
	// the key is finished (done, dead or canceled): one at a time, in
	// enqueue order. An earlier message that is scheduled for later, or
	// suspended, holds the later ones back until it is presented or
	// canceled.
	OrderingKey string
	// NotBefore, when later than the database's clock at the enqueue,
	// schedules the message: no relay presents it before that time (nor
	// the later messages of its ordering key). The zero time: due at once.
	NotBefore time.Time
}

// Envelope is a message as the relay hands it to a Sink.
type Envelope struct {
	// ID is the message's ID, "<storage key>/<sequence>" (see ID): the
	// same on every attempt, for downstream deduplication (JetStream's
	// Nats-Msg-Id, a consumer's idempotency key).
	ID          string
	Topic       string
	Payload     []byte
	Headers     map[string]string
	OrderingKey string
	// Attempt counts the presentations of the message: 1 for the first.
	// A failed publish and a claim that ran out (its relay died) each
	// count one; a suspension does not.
	Attempt int
	// EnqueuedAt is the server's clock when the handler enqueued the
	// message, in the transaction that then committed it.
	EnqueuedAt time.Time
}

// ID returns the ID of the message at seq (from 1) among the messages of
// the record with storage key storageKey: "<storage key>/<seq>".
func ID(storageKey string, seq int) string { return lifecycle.MessageID(storageKey, seq) }

// ErrInvalidID is wrapped by the errors of ParseID (it is
// lifecycle.ErrInvalidID).
var ErrInvalidID = lifecycle.ErrInvalidID

// ParseID splits a message ID made by ID into its storage key and
// sequence. It returns an error wrapping ErrInvalidID for anything else.
func ParseID(id string) (storageKey string, seq int, err error) {
	return lifecycle.ParseMessageID(id)
}
