package idemnats

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/go-idempotency/idempotency"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrNoKey is wrapped by the error of a key function for a message it
// cannot take a key from. Process terms such a message.
var ErrNoKey = errors.New("idemnats: message has no key")

// DefaultKey returns a message's Nats-Msg-Id header (jetstream.MsgIDHeader),
// the key its producer chose, when it has one. Else it returns a key of
// the stored message: its stream name, stream sequence and the time the
// stream stored it, in nanoseconds, as "ORDERS:42:1718000000123456789".
// Every redelivery of the message shares that key, but a message published
// again does not, nor a message that a stream deleted and created again
// stores under the same sequence: the timestamp tells them apart, so that
// a new message never meets an old one's record.
//
// The trade: a publisher that retries a publication without Nats-Msg-Id
// (its ack was lost) stores the message twice, and DefaultKey runs the
// handler for each. Publishers that retry should set Nats-Msg-Id
// (jetstream.WithMsgID), which JetStream also uses to drop duplicates
// within the stream's Duplicates window; the key outlives that window by
// the Runner's TTL. MsgIDKey refuses messages without it instead.
func DefaultKey(msg jetstream.Msg) (string, error) {
	if id := msg.Headers().Get(jetstream.MsgIDHeader); id != "" {
		return id, nil
	}
	meta, err := msg.Metadata()
	if err != nil {
		return "", fmt.Errorf("%w: no %s header, and no JetStream metadata: %w", ErrNoKey, jetstream.MsgIDHeader, err)
	}
	at := ":" + strconv.FormatUint(meta.Sequence.Stream, 10) + ":" + strconv.FormatInt(meta.Timestamp.UnixNano(), 10)
	if len(meta.Stream)+len(at) > idempotency.MaxKeyLen {
		// A stream name may be longer than a key can be: its digest
		// keeps the key within bounds and as unique.
		sum := sha256.Sum256([]byte(meta.Stream))
		return hex.EncodeToString(sum[:]) + at, nil
	}
	return meta.Stream + at, nil
}

// MsgIDKey is a key function (for WithKey) that takes the key from the
// Nats-Msg-Id header only: a message without one gets an error wrapping
// ErrNoKey, and Process terms and reports it rather than run it. Use it
// when every publisher sets Nats-Msg-Id, so that a publisher that forgot
// it is seen at once, instead of its retried publications running once
// each (see DefaultKey).
func MsgIDKey(msg jetstream.Msg) (string, error) {
	if id := msg.Headers().Get(jetstream.MsgIDHeader); id != "" {
		return id, nil
	}
	return "", fmt.Errorf("%w: no %s header", ErrNoKey, jetstream.MsgIDHeader)
}

// HeaderKey returns a key function (for WithKey) that takes the key from
// the message's header name, such as a business key ("Order-Id") that
// every publication of the same request carries. A message without the
// header gets an error wrapping ErrNoKey. It panics if name is empty.
func HeaderKey(name string) func(msg jetstream.Msg) (string, error) {
	if name == "" {
		panic("idemnats: HeaderKey needs a header name")
	}
	return func(msg jetstream.Msg) (string, error) {
		if v := msg.Headers().Get(name); v != "" {
			return v, nil
		}
		return "", fmt.Errorf("%w: no %s header", ErrNoKey, name)
	}
}
