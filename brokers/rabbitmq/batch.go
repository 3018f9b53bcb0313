package idemrabbit

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/go-idempotency/idempotency/outbox"
)

// DefaultWindow is how many messages PublishBatch keeps waiting for their
// confirms on its channel at once.
const DefaultWindow = 256

var _ outbox.BatchSink = (*Sink)(nil)

// PublishBatch publishes es on one of the Sink's channels in confirm
// mode, pipelined: it sends the next message while fewer than
// DefaultWindow wait for their confirms, rather than one at a time. Each
// message is published as Publish publishes it (persistent, mandatory,
// its ID as message_id). It returns one error per envelope, in the order
// of es: nil for one the broker confirmed; an error wrapping ErrUnroutable
// for one the broker returned as routed to no queue (it stays retryable:
// the queue may be declared later); one wrapping ErrNacked for one the
// broker refused, or whose confirm the channel's closing cut off.
//
// The wait for a channel, and the dial it may need, are bounded by
// WithTimeout, as each message's wait for its confirm is, from its send.
// Once the channel closed (the connection broke, the exchange does not
// exist), or ctx ended, the envelopes not sent yet are not sent, and
// their errors say "not published"; an envelope whose confirm had not
// come by then gets an error too. As with Publish, any error means that
// its envelope may or may not have been published, and the relay
// publishes it again later, under the same ID.
func (s *Sink) PublishBatch(ctx context.Context, es []outbox.Envelope) []error {
	errs := make([]error, len(es))
	if len(es) == 0 {
		return errs
	}
	c, err := s.acquire(ctx)
	if err != nil {
		for i, e := range es {
			errs[i] = fmt.Errorf("idemrabbit: %s not published: %w", e.ID, err)
		}
		return errs
	}
	defer func() { <-s.slots }()

	b := &batch{sink: s, c: c, es: es, errs: errs}
	defer b.stopTimer()
	var stop error // why the envelopes from i on are not sent
	i := 0
	for ; i < len(es); i++ {
		if stop = b.room(ctx); stop != nil {
			break
		}
		b.send(i)
	}
	for ; i < len(es); i++ {
		errs[i] = fmt.Errorf("idemrabbit: %s not published: %w", es[i].ID, stop)
	}
	for len(b.waiting) > 0 {
		b.awaitOldest(ctx)
	}
	// A channel with a confirm given up on, or closed, is not used again:
	// a late confirm or return would be taken for another message's.
	if b.abandoned || b.closed != nil {
		s.discard(c)
	} else {
		s.idle <- c
	}
	return errs
}

// acquire takes one of the Sink's channel slots, within WithTimeout, and
// returns a channel to publish on; the caller gives the slot back.
func (s *Sink) acquire(ctx context.Context) (*confirmedCh, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.timeout)
	defer cancel()
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	c, err := s.channel()
	if err != nil {
		<-s.slots
		return nil, err
	}
	return c, nil
}

// batch is one PublishBatch call under way.
type batch struct {
	sink *Sink
	c    *confirmedCh
	es   []outbox.Envelope
	errs []error
	// waiting holds the messages sent whose confirms have not been
	// read, oldest first: the broker confirms a channel's messages in
	// the order it received them.
	waiting []sent
	// closed is why the channel closed, once it did.
	closed error
	// abandoned is set once a confirm was given up on.
	abandoned bool
	timer     *time.Timer
}

// sent is a message of the batch sent, waiting for its confirm.
type sent struct {
	i       int // its index in es
	confirm *amqp.DeferredConfirmation
	by      time.Time // when waiting for its confirm ends: WithTimeout after its send
}

// room waits until fewer than DefaultWindow messages wait for their
// confirms, and returns why the next may not be sent: the channel closed,
// or ctx ended.
func (b *batch) room(ctx context.Context) error {
	for len(b.waiting) >= DefaultWindow && b.closed == nil && ctx.Err() == nil {
		b.awaitOldest(ctx)
	}
	switch {
	case b.closed != nil:
		return b.closed
	case ctx.Err() != nil:
		return context.Cause(ctx)
	}
	return nil
}

// send publishes es[i] and adds it to the messages waiting, or records
// why it could not be sent.
func (b *batch) send(i int) {
	e := b.es[i]
	// room checked ctx just before: the client's context variant would
	// only check it again.
	dc, err := b.c.ch.PublishWithDeferredConfirm(b.sink.cfg.exchange, b.sink.cfg.routingKey(e), true, false, publishing(e))
	if err != nil {
		b.errs[i] = fmt.Errorf("idemrabbit: publishing %s: %w", e.ID, err)
		if b.c.ch.IsClosed() {
			b.closed = fmt.Errorf("the channel closed: %w", err)
		}
		return
	}
	b.waiting = append(b.waiting, sent{i: i, confirm: dc, by: time.Now().Add(b.sink.cfg.timeout)})
}

// awaitOldest waits for the oldest message's confirm, until its time is
// up or ctx ended, records its outcome and removes it from the waiting.
func (b *batch) awaitOldest(ctx context.Context) {
	m := b.waiting[0]
	b.waiting = b.waiting[1:]
	select {
	case <-m.confirm.Done():
		b.confirmed(m)
		return
	default:
	}
	if ctx.Err() != nil {
		b.giveUp(m, fmt.Errorf("no confirm before the context ended: %w", context.Cause(ctx)))
		return
	}
	if b.timer == nil {
		b.timer = time.NewTimer(time.Until(m.by))
	} else {
		b.timer.Reset(time.Until(m.by))
	}
	select {
	case <-m.confirm.Done():
		b.confirmed(m)
	case <-ctx.Done():
		b.giveUp(m, fmt.Errorf("no confirm before the context ended: %w", context.Cause(ctx)))
	case <-b.timer.C:
		b.giveUp(m, fmt.Errorf("no confirm within %v: %w", b.sink.cfg.timeout, context.DeadlineExceeded))
	}
}

// confirmed records the outcome of m, whose confirm came.
func (b *batch) confirmed(m sent) {
	e := b.es[m.i]
	if !m.confirm.Acked() {
		if b.closed == nil {
			b.closed = b.closing()
		}
		if b.closed != nil {
			b.errs[m.i] = fmt.Errorf("%w: %s: %v", ErrNacked, e.ID, b.closed)
		} else {
			b.errs[m.i] = fmt.Errorf("%w: %s", ErrNacked, e.ID)
		}
		return
	}
	// The broker sends a mandatory message's return before its confirm,
	// and the client hands it to c.returns before it reads the confirm:
	// the return of m, if any, is there now. Those of the messages
	// confirmed before m were taken with their confirms.
	b.takeReturns(m)
}

// takeReturns gives each message returned so far, m or one still
// waiting, its ErrUnroutable error.
func (b *batch) takeReturns(m sent) {
	for {
		select {
		case r, ok := <-b.c.returns:
			if !ok {
				return
			}
			b.returned(r, m)
		default:
			return
		}
	}
}

// returned records r as the outcome of the message it returns: the first
// one with its ID among m and those still waiting. A return of none of
// them is of a message whose confirm was given up on.
func (b *batch) returned(r amqp.Return, m sent) {
	err := fmt.Errorf("%w: %s to exchange %q with routing key %q: %d %s", ErrUnroutable, r.MessageId, r.Exchange, r.RoutingKey, r.ReplyCode, r.ReplyText)
	for _, w := range append([]sent{m}, b.waiting...) {
		if b.es[w.i].ID == r.MessageId && b.errs[w.i] == nil {
			b.errs[w.i] = err
			return
		}
	}
}

// closing returns why the channel closed, or nil while it is open.
func (b *batch) closing() error {
	select {
	case reason := <-b.c.closes:
		if reason != nil {
			return fmt.Errorf("the channel closed: %w", reason)
		}
		return fmt.Errorf("the channel closed")
	default:
	}
	if b.c.ch.IsClosed() {
		return fmt.Errorf("the channel closed")
	}
	return nil
}

// giveUp records that m's confirm did not come in time.
func (b *batch) giveUp(m sent, err error) {
	b.abandoned = true
	b.errs[m.i] = fmt.Errorf("idemrabbit: publishing %s: waiting for the confirm: %w", b.es[m.i].ID, err)
}

func (b *batch) stopTimer() {
	if b.timer != nil {
		b.timer.Stop()
	}
}
