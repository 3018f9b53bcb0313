package outbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Message is a message a handler enqueues.
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
	OrderingKey string
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
	// count one.
	Attempt int
	// EnqueuedAt is the server's clock when the handler enqueued the
	// message, in the transaction that then committed it.
	EnqueuedAt time.Time
}

// Sink publishes envelopes. Publish returns nil only once the broker
// confirmed the message (JetStream's ack, RabbitMQ's publisher confirm);
// any error means it may or may not have been published, and the relay
// tries again later (at least once). Publish should return by ctx's
// deadline, which ends before the relay's claim on the message runs out.
// A relay with relay.WithConcurrency above 1 calls Publish from several
// goroutines at once, each with a message of another ordering key.
type Sink interface {
	Publish(ctx context.Context, e Envelope) error
}

// SinkFunc is a function as a Sink.
type SinkFunc func(ctx context.Context, e Envelope) error

// Publish calls f.
func (f SinkFunc) Publish(ctx context.Context, e Envelope) error { return f(ctx, e) }

// The statuses of a message in the outbox table. A message is pending
// until a relay claims it; a claimed message is done once its sink
// confirmed it, back to pending (due after a backoff) when the publish
// failed or the claim ran out, and dead when that happened for the last
// allowed attempt. Done and dead are terminal: purged after the relay's
// retention; an operator can requeue a dead message (idemctl outbox
// requeue).
const (
	StatusPending = "pending"
	StatusClaimed = "claimed"
	StatusDone    = "done"
	StatusDead    = "dead"
)

// ID returns the ID of the message at seq (from 1) among the messages of
// the record with storage key storageKey: "<storage key>/<seq>".
func ID(storageKey string, seq int) string { return storageKey + "/" + strconv.Itoa(seq) }

// ErrInvalidID is wrapped by the errors of ParseID.
var ErrInvalidID = errors.New("outbox: invalid message ID")

// ParseID splits a message ID made by ID into its storage key and
// sequence. It returns an error wrapping ErrInvalidID for anything else.
func ParseID(id string) (storageKey string, seq int, err error) {
	i := strings.LastIndexByte(id, '/')
	if i <= 0 {
		return "", 0, fmt.Errorf("%w: %q is not <storage key>/<sequence>", ErrInvalidID, id)
	}
	seq, err = strconv.Atoi(id[i+1:])
	if err != nil || seq < 1 || strconv.Itoa(seq) != id[i+1:] {
		return "", 0, fmt.Errorf("%w: %q does not end in a sequence from 1", ErrInvalidID, id)
	}
	return id[:i], seq, nil
}
