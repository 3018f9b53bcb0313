package natsink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/go-idempotency/idempotency/outbox"
)

var _ outbox.BatchSink = (*Sink)(nil)

// PublishBatch publishes es with JetStream's asynchronous publish, each
// message as Publish sends it (its ID as Nats-Msg-Id, the stream expected
// under WithStream), keeping up to WithWindow publications waiting for
// their acks at once, and returns one error per envelope, in the order of
// es: nil for one the stream acknowledged, whether it stored it now or had
// stored it under the same ID within its Duplicates window. An envelope
// whose subject no publication can go to (empty, or with a space, a
// control character, an empty token or a wildcard) is refused permanently,
// as Publish refuses it: its error wraps outbox.ErrPermanent, and the
// relay does not publish it again.
//
// It returns once every publication has its ack, its error, or has waited
// for it longer than WithTimeout from its send, or once ctx ended: the
// envelopes still waiting then, and those not sent, get an error wrapping
// ctx's cause. A lost connection fails the publications waiting for their
// acks at once (nats.ErrDisconnected), and the envelopes not sent yet are
// not sent while the client is not connected: they fail too, rather than
// wait in the client's reconnect buffer. As with Publish, any other error
// means that its envelope may or may not be in the stream, and the relay
// publishes it again later, under the same ID; the error of an envelope
// that was not sent says "not published".
func (s *Sink) PublishBatch(ctx context.Context, es []outbox.Envelope) []error {
	b := &batch{sink: s, es: es, errs: make([]error, len(es))}
	defer b.stopTimer()
	var stop error // why the envelopes from i on are not sent
	i := 0
	for ; i < len(es); i++ {
		if stop = b.room(ctx); stop != nil {
			break
		}
		b.send(ctx, i)
	}
	for ; i < len(es); i++ {
		b.errs[i] = fmt.Errorf("natsink: %s not published: %w", es[i].ID, stop)
	}
	for len(b.waiting) > 0 {
		b.awaitOldest(ctx)
	}
	return b.errs
}

// batch is one PublishBatch call under way.
type batch struct {
	sink *Sink
	es   []outbox.Envelope
	errs []error
	// waiting holds the publications waiting for their acks, oldest
	// first: a stream acknowledges in the order it receives, so the
	// oldest is the next to end.
	waiting []publication
	timer   *time.Timer
}

// publication is a message of a batch sent, waiting for its ack.
type publication struct {
	i       int // its index in es
	subject string
	ack     jetstream.PubAckFuture
	by      time.Time // when waiting for its ack ends: WithTimeout after its send
}

// room waits until fewer than the window's publications wait for their
// acks, and returns why the next may not be sent: ctx ended, or the
// client is not connected to the server.
func (b *batch) room(ctx context.Context) error {
	for len(b.waiting) >= b.sink.cfg.window && ctx.Err() == nil {
		b.awaitOldest(ctx)
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if !b.sink.js.Conn().IsConnected() {
		return nats.ErrDisconnected
	}
	return nil
}

// send publishes es[i] and adds it to the publications waiting, or
// records why it could not be sent.
func (b *batch) send(ctx context.Context, i int) {
	e := b.es[i]
	subject := b.sink.cfg.subject(e)
	if err := checkSubject(e, subject); err != nil {
		b.errs[i] = err
		return
	}
	msg := nats.NewMsg(subject)
	msg.Data = e.Payload
	for k, v := range e.Headers {
		msg.Header.Set(k, v)
	}
	opts := []jetstream.PublishOpt{jetstream.WithMsgID(e.ID)}
	if b.sink.cfg.stream != "" {
		opts = append(opts, jetstream.WithExpectStream(b.sink.cfg.stream))
	}
	for {
		ack, err := b.sink.js.PublishMsgAsync(msg, opts...)
		// The JetStream context's own cap on pending publications is
		// shared with every other publisher on it: when it is reached,
		// the oldest publication of this batch ending makes room.
		if errors.Is(err, jetstream.ErrTooManyStalledMsgs) && len(b.waiting) > 0 && ctx.Err() == nil {
			b.awaitOldest(ctx)
			continue
		}
		if errors.Is(err, nats.ErrBadSubject) {
			// No server takes the subject: publishing again cannot help.
			b.errs[i] = outbox.Permanent(fmt.Errorf("natsink: publishing %s to %q: %w", e.ID, subject, err))
			return
		}
		if err != nil {
			b.errs[i] = fmt.Errorf("natsink: publishing %s to %s: %w", e.ID, subject, err)
			return
		}
		b.waiting = append(b.waiting, publication{i: i, subject: subject, ack: ack, by: time.Now().Add(b.sink.cfg.timeout)})
		return
	}
}

// awaitOldest waits for the oldest publication's ack, until its time is
// up or ctx ended, records its outcome and removes it from the waiting.
func (b *batch) awaitOldest(ctx context.Context) {
	p := b.waiting[0]
	b.waiting = b.waiting[1:]
	ok, failed := p.ack.Ok(), p.ack.Err()
	// An ack that has come counts even after ctx ended.
	select {
	case <-ok:
		return
	case err := <-failed:
		b.failed(p, err)
		return
	default:
	}
	if ctx.Err() != nil {
		b.failed(p, fmt.Errorf("no ack before the context ended: %w", context.Cause(ctx)))
		return
	}
	if b.timer == nil {
		b.timer = time.NewTimer(time.Until(p.by))
	} else {
		b.timer.Reset(time.Until(p.by))
	}
	select {
	case <-ok:
	case err := <-failed:
		b.failed(p, err)
	case <-ctx.Done():
		b.failed(p, fmt.Errorf("no ack before the context ended: %w", context.Cause(ctx)))
	case <-b.timer.C:
		b.failed(p, fmt.Errorf("no ack within %v: %w", b.sink.cfg.timeout, context.DeadlineExceeded))
	}
}

func (b *batch) failed(p publication, err error) {
	b.errs[p.i] = fmt.Errorf("natsink: publishing %s to %s: %w", b.es[p.i].ID, p.subject, err)
}

func (b *batch) stopTimer() {
	if b.timer != nil {
		b.timer.Stop()
	}
}
