// Package natsink publishes an outbox's messages to NATS JetStream: it is
// the outbox.Sink of a relay (outbox/relay) that publishes to JetStream.
//
// Each message is published with its ID (outbox.Envelope.ID, stable
// across the relay's retries) as its Nats-Msg-Id header, and Publish
// returns nil only once the stream acknowledged it. The relay delivers at
// least once: it publishes a message again when it cannot know whether the
// stream stored it (a publication that timed out, a relay that died
// between the stream's ack and marking the message done). JetStream drops
// a publication whose Nats-Msg-Id it stored within the stream's
// Duplicates window, so within that window the relay's retries store each
// message exactly once in the stream:
//
//	sink := natsink.New(js, natsink.WithStream("PAYMENTS"))
//	r := relay.New(pool, sink)
//	err := r.Run(ctx)
//
// The Sink is an outbox.BatchSink too: PublishBatch publishes a batch with
// JetStream's asynchronous publish, keeping a window of publications
// waiting for their acks (WithWindow) instead of one at a time.
//
// # The duplicate window
//
// A message is stored twice when the relay publishes it again later than
// the stream's Duplicates window after the copy the stream stored. The
// relay does so after at most the longest of
//
//   - the claim lease plus the poll interval, when a relay died (or lost
//     its database) after the stream stored the message and before it
//     marked the message done: another relay claims it again once the
//     lease ran out;
//   - the longest backoff, when the stream stored a publication whose ack
//     never reached the relay (a timeout, a cut connection);
//
// plus the time the broker stays unreachable, or no relay runs, meanwhile.
// Set the stream's Duplicates to at least that (WindowNeeded gives the
// relay's part), with room to spare: CheckDuplicates does the comparison.
// JetStream's default window is 2 minutes; the relay's defaults (a 30s
// lease, a 5s poll, a backoff up to 5 minutes) need 5 minutes, so give
// the stream more, or the relay a shorter backoff cap
// (relay.WithBackoff(time.Second, time.Minute) needs 1 minute and leaves a
// default window a minute of outage). Past the
// window, the republished message is a second message in the stream with
// the same Nats-Msg-Id; a consumer that deduplicates on it (idemnats's
// Processor does, by default, for its Runner's TTL) still runs once.
package natsink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/go-idempotency/idempotency/outbox"
)

// Errors of the sink.
var (
	// ErrNoSubject is wrapped by the error of Publish for a message whose
	// subject is empty (its Topic, or what WithSubject made of it): a
	// permanent refusal (outbox.ErrPermanent), as is a subject that is not
	// one to publish to (nats.ErrBadSubject).
	ErrNoSubject = errors.New("natsink: message has no subject")
	// ErrWindowTooShort is wrapped by the error of CheckDuplicates for a
	// stream whose Duplicates window is shorter than needed.
	ErrWindowTooShort = errors.New("natsink: the stream's duplicate window is too short")
)

// Sink publishes outbox messages to JetStream (see the package
// documentation). It is safe for concurrent use.
type Sink struct {
	js  jetstream.JetStream
	cfg config
}

var _ outbox.Sink = (*Sink)(nil)

// New returns a Sink publishing on js. It panics when js is nil.
func New(js jetstream.JetStream, opts ...Option) *Sink {
	if js == nil {
		panic("natsink: New needs a JetStream context")
	}
	cfg := config{
		subject: func(e outbox.Envelope) string { return e.Topic },
		timeout: DefaultTimeout,
		window:  DefaultWindow,
	}
	for _, o := range opts {
		o(&cfg)
	}
	return &Sink{js: js, cfg: cfg}
}

// Publish publishes e and returns nil once the stream acknowledged it,
// whether it stored e now or had stored it under the same ID within its
// Duplicates window. Any error means that e may or may not be in the
// stream: the relay publishes it again later, under the same ID.
func (s *Sink) Publish(ctx context.Context, e outbox.Envelope) error {
	_, err := s.PublishAck(ctx, e)
	return err
}

// PublishAck is Publish, returning the stream's acknowledgement:
// PubAck.Duplicate reports that the stream had stored e already.
func (s *Sink) PublishAck(ctx context.Context, e outbox.Envelope) (*jetstream.PubAck, error) {
	subject := s.cfg.subject(e)
	if err := checkSubject(e, subject); err != nil {
		return nil, err
	}
	msg := nats.NewMsg(subject)
	msg.Data = e.Payload
	for k, v := range e.Headers {
		msg.Header.Set(k, v)
	}
	opts := []jetstream.PublishOpt{jetstream.WithMsgID(e.ID)}
	if s.cfg.stream != "" {
		opts = append(opts, jetstream.WithExpectStream(s.cfg.stream))
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.timeout)
	defer cancel()
	ack, err := s.js.PublishMsg(ctx, msg, opts...)
	if errors.Is(err, nats.ErrBadSubject) {
		return nil, outbox.Permanent(fmt.Errorf("natsink: publishing %s to %q: %w", e.ID, subject, err))
	}
	if err != nil {
		return nil, fmt.Errorf("natsink: publishing %s to %s: %w", e.ID, subject, err)
	}
	return ack, nil
}

// checkSubject returns a permanent refusal (outbox.Permanent) of e when its
// subject is one no publication can go to: empty (ErrNoSubject), or not a
// NATS subject to publish to (nats.ErrBadSubject): a space or a control
// character, an empty token, or a wildcard. The relay marks such a message
// dead at once, where it would retry it in vain until its last attempt.
func checkSubject(e outbox.Envelope, subject string) error {
	if subject == "" {
		return outbox.Permanent(fmt.Errorf("%w: message %s, topic %q", ErrNoSubject, e.ID, e.Topic))
	}
	for _, token := range strings.Split(subject, ".") {
		if token == "" || token == "*" || token == ">" || strings.ContainsFunc(token, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			return outbox.Permanent(fmt.Errorf("natsink: message %s, subject %q: %w", e.ID, subject, nats.ErrBadSubject))
		}
	}
	return nil
}

// WindowNeeded returns the longest time after which a relay with the
// claim lease, poll interval and backoff cap given can publish a message
// again while the broker answers and a relay runs: the stream's
// Duplicates window must be at least this, plus the broker outage (or the
// time with no relay running) to ride out without a duplicate.
func WindowNeeded(claimLease, pollInterval, maxBackoff time.Duration) time.Duration {
	return max(claimLease+pollInterval, maxBackoff)
}

// CheckDuplicates returns an error wrapping ErrWindowTooShort when the
// Duplicates window of stream is shorter than need: the longest time
// after which the relay can publish a message again (see the package
// documentation), plus the broker outage to ride out without a duplicate.
func CheckDuplicates(ctx context.Context, js jetstream.JetStream, stream string, need time.Duration) error {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("natsink: stream %s: %w", stream, err)
	}
	if have := st.CachedInfo().Config.Duplicates; have < need {
		return fmt.Errorf("%w: stream %s keeps message IDs for %v, the relay can publish a message again after %v", ErrWindowTooShort, stream, have, need)
	}
	return nil
}
