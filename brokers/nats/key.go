package idemnats

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrNoKey is wrapped by the error of a key function for a message it
// cannot take a key from. Process terms such a message.
var ErrNoKey = errors.New("idemnats: message has no key")

// DefaultKey returns a message's Nats-Msg-Id header (jetstream.MsgIDHeader)
// when it has one, and else its stream name and stream sequence, as
// "ORDERS:42": every redelivery of a message shares them, but a message
// published again does not, and a stream deleted and created again counts
// its sequences from 1, so that its messages meet the records of the old
// ones (for the records' TTL). Publishers that retry should set
// Nats-Msg-Id (jetstream.WithMsgID), which JetStream also uses to drop
// duplicates within the stream's Duplicates window; the key outlives that
// window by the Runner's TTL.
func DefaultKey(msg jetstream.Msg) (string, error) {
	if id := msg.Headers().Get(jetstream.MsgIDHeader); id != "" {
		return id, nil
	}
	meta, err := msg.Metadata()
	if err != nil {
		return "", fmt.Errorf("%w: no %s header, and no JetStream metadata: %w", ErrNoKey, jetstream.MsgIDHeader, err)
	}
	return meta.Stream + ":" + strconv.FormatUint(meta.Sequence.Stream, 10), nil
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
