package state

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"strings"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
)

// EventKey returns the key that names ref's events: the hex SHA-256 of
// its scope, machine and id, each length-prefixed, under a namespace of
// its own (so that it never equals a storage key of the idempotency
// middleware's). It is the storage key of the events' outbox IDs (see
// EventID) and the key of the record's history rows.
func EventKey(ref Ref) string {
	h := sha256.New()
	h.Write([]byte("idempotency/state\x00"))
	for _, part := range []string{ref.Scope, ref.Machine, ref.ID} {
		var n [binary.MaxVarintLen64]byte
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(part)))])
		h.Write([]byte(part))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// EventID returns the ID of the event of the transition that made
// version of the record at ref: "<EventKey(ref)>/<version>", in the
// outbox's ID shape (outbox.ID). Each transition has its own, the same on
// every delivery of its message, and the outbox refuses a second message
// of one ID: a transition's event is never written twice, and a
// redelivered one deduplicates downstream (JetStream's Nats-Msg-Id, a
// consumer's idempotency key).
func EventID(ref Ref, version int64) string {
	return lifecycle.MessageID(EventKey(ref), int(version))
}

// OrderingKey returns the outbox ordering key of ref's events:
// "<scope>/<machine>/<id>", which the relays publish one at a time, in
// version order. Machine and id hold no '/', so two records never share
// one, nor do two tenants.
func OrderingKey(ref Ref) string { return ref.Scope + "/" + ref.Machine + "/" + ref.ID }

// Topic returns the topic of the events of machine's records:
// "<prefix>.<machine>" (see WithTopicPrefix).
func (s *Store) Topic(machine string) string { return s.cfg.topic + "." + machine }

// event returns the event of transition c of ref, if it commits: it makes
// the version after c.ExpectedVersion.
func (s *Store) event(ctx context.Context, ref Ref, c Change) Event {
	version := c.ExpectedVersion + 1
	ev := Event{ID: EventID(ref, version), Ref: ref, From: c.From, To: c.To, Version: version}
	if info, ok := idempotency.FromContext(ctx); ok {
		ev.Cause.Key, ev.Cause.StorageKey, ev.Cause.Epoch = info.Key, info.StorageKey, info.Epoch
	}
	if s.cfg.trace != nil {
		ev.Cause.Trace = traceContext(s.cfg.trace(ctx))
	}
	return ev
}

// message is an event's outbox message and history row, as the
// transition's statement takes them.
type message struct {
	key, cause, topic, headers, orderingKey string
	payload                                 []byte
}

// message returns ev as the transition's statement writes it.
func (s *Store) message(ev Event) (message, error) {
	payload, err := json.Marshal(ev)
	if err != nil {
		return message{}, err
	}
	cause, err := json.Marshal(ev.Cause)
	if err != nil {
		return message{}, err
	}
	headers := []byte("{}")
	if len(ev.Cause.Trace) > 0 {
		if headers, err = json.Marshal(ev.Cause.Trace); err != nil {
			return message{}, err
		}
	}
	return message{
		key: EventKey(ev.Ref), cause: string(cause), topic: s.Topic(ev.Machine), headers: string(headers),
		orderingKey: OrderingKey(ev.Ref), payload: payload,
	}, nil
}

// The W3C trace context's headers, as a transition keeps them.
const (
	traceparent = "traceparent"
	tracestate  = "tracestate"
	// maxTraceValue bounds a kept value, in bytes: the W3C's bound of a
	// tracestate.
	maxTraceValue = 512
)

// traceContext returns the W3C trace context among the propagation
// headers h: traceparent and tracestate (named in any case, kept in lower
// case) whose values are 1 to maxTraceValue bytes of printable ASCII; nil
// when there is no traceparent.
func traceContext(h map[string]string) map[string]string {
	var tc map[string]string
	for k, v := range h {
		k = strings.ToLower(k)
		if (k != traceparent && k != tracestate) || !printable(v) {
			continue
		}
		if tc == nil {
			tc = map[string]string{}
		}
		tc[k] = v
	}
	if tc[traceparent] == "" {
		return nil
	}
	return tc
}

// printable reports whether v is 1 to maxTraceValue bytes of printable
// ASCII.
func printable(v string) bool {
	if v == "" || len(v) > maxTraceValue {
		return false
	}
	for i := range len(v) {
		if v[i] < ' ' || v[i] > '~' {
			return false
		}
	}
	return true
}
