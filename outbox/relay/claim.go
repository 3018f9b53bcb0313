package relay

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
)

// claim is one claim statement's hold on its messages, kept the way the
// idempotency core keeps a request's lease: counted conservatively from
// before the statement that took or extended it was sent, never from its
// reply, and ended a tenth early, so that the relay gives a message up
// before another relay could take it back, whatever the delays and the
// clocks' rates. While messages of the claim are held (waiting for their
// turn, with the sink, or presented and waiting for their mark), the
// claim is extended every third of a lease; when an extend finds a
// message no longer claimed under the token (an operator canceled or
// suspended it, or another relay took it back), or the claim runs out
// without a successful extend, the message is lost, and the sink's
// context of a call that presents only lost messages is cancelled with a
// cause wrapping outbox.ErrClaimLost: a Publish's as soon as its message
// is lost, a PublishBatch's once every message of the call is (a message
// lost alone is not taken back from a call that publishes others: its
// mark is refused instead).
type claim struct {
	r     *Relay
	ctx   context.Context // the observer's: Run's values, not its end
	stop  <-chan struct{} // Run's end: no extend after it
	token string

	mu        sync.Mutex
	end       time.Time // when the conservative claim runs out
	timer     *time.Timer
	extending bool
	stopped   bool
	held      map[int64]*hold
	extendErr error // the last failed extend, while the claim survives it
}

// holdState is where a held message is.
type holdState uint8

const (
	waiting    holdState = iota // claimed, its turn not come yet
	presenting                  // with the sink
	presented                   // the sink's call returned; its mark waits for the batch's turn
	settled                     // marked, or handed back: no longer extended
)

// hold is the claim on one message.
type hold struct {
	m     message
	state holdState
	lost  error     // why the claim on it is lost; nil while held
	call  *sinkCall // the sink's call presenting it, while it does
}

// sinkCall is one call of the sink: a Publish of one message, or a
// PublishBatch of a batch's.
type sinkCall struct {
	cancel context.CancelCauseFunc // ends the call's context
	left   int                     // its messages neither finished nor lost
}

// message is a claimed message the relay could read.
type message struct {
	id  int64
	env outbox.Envelope
}

// newClaim starts keeping the claim with token on msgs, taken by a
// statement sent at sent.
func (r *Relay) newClaim(ctx context.Context, token string, sent time.Time, msgs []message) *claim {
	c := &claim{r: r, ctx: context.WithoutCancel(ctx), stop: ctx.Done(), token: token, held: make(map[int64]*hold, len(msgs))}
	for _, m := range msgs {
		c.held[m.id] = &hold{m: m}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.end = sent.Add(r.cfg.lease - leaseGuard(r.cfg.lease))
	c.timer = time.AfterFunc(time.Until(sent.Add(extendEvery(r.cfg.lease))), c.beat)
	return c
}

// leaseGuard is how much earlier than the database the relay counts a
// claim as over: a tenth of the lease, for the lateness of a timer on a
// busy machine and the difference between the clocks' rates.
func leaseGuard(lease time.Duration) time.Duration { return lease / 10 }

// extendEvery is the interval of the extends: a third of a lease, so that
// a failed extend leaves time for another before the claim runs out.
func extendEvery(lease time.Duration) time.Duration { return lease / 3 }

// begin hands the messages ids to the sink in one call, and returns the
// call's context (Run's values, cancelled once the claim on every message
// of the call is lost) and the messages handed, in the order of ids: those
// whose claim is lost are not, nor is any when too little of the claim is
// left (less than half a lease).
func (c *claim) begin(ids ...int64) (context.Context, []int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Until(c.end) < c.r.cfg.lease/2 {
		return nil, nil
	}
	var begun []int64
	for _, id := range ids {
		if c.held[id].lost == nil {
			begun = append(begun, id)
		}
	}
	if len(begun) == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithCancelCause(c.ctx)
	call := &sinkCall{cancel: cancel, left: len(begun)}
	for _, id := range begun {
		h := c.held[id]
		h.state, h.call = presenting, call
	}
	return ctx, begun
}

// finish records that the sink's call returned for message id: the claim
// on it is kept until its outcome is marked, unless it was settled
// meanwhile (a local run marks its message done itself). The call's
// context ends with its last message.
func (c *claim) finish(id int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.held[id]
	if h.state == presenting {
		h.state = presented
	}
	c.leaveCallLocked(h, nil)
}

// leaveCallLocked takes h out of the sink's call presenting it, ending the
// call's context with cause (nil: the call returned) once none of its
// messages is left.
func (c *claim) leaveCallLocked(h *hold, cause error) {
	call := h.call
	if call == nil {
		return
	}
	h.call = nil
	if call.left--; call.left == 0 {
		call.cancel(cause)
	}
}

// settle stops extending the claim on ids, before they are marked or
// handed back: an extend that no longer finds them then is not a loss.
func (c *claim) settle(ids ...int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		c.held[id].state = settled
	}
}

// close stops keeping the claim, once every message of it is marked.
func (c *claim) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
	c.timer.Stop()
}

// beat extends the claim on the messages held, or gives them up when the
// claim has run out.
func (c *claim) beat() {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return
	}
	now := time.Now()
	if !now.Before(c.end) {
		cause := fmt.Errorf("%w: the claim ran out before an extend succeeded", outbox.ErrClaimLost)
		select {
		case <-c.stop:
			cause = fmt.Errorf("%w: the claim ran out after the relay stopped extending it", outbox.ErrClaimLost)
		default:
			if c.extendErr != nil {
				cause = fmt.Errorf("%w (last extend: %v)", cause, c.extendErr)
			}
		}
		lost := c.loseLocked(c.heldIDs(), cause)
		c.mu.Unlock()
		c.report(lost, nil)
		return
	}
	ids := c.heldIDs()
	stopping := false
	select {
	case <-c.stop:
		stopping = true
	default:
	}
	if c.extending || stopping || len(ids) == 0 {
		// Nothing to extend now: the timer stands for the claim's end,
		// or the next beat.
		c.timer.Reset(min(c.end.Sub(now), extendEvery(c.r.cfg.lease)))
		c.mu.Unlock()
		return
	}
	c.extending = true
	end := c.end
	c.timer.Reset(end.Sub(now)) // should the extend outlast the claim
	c.mu.Unlock()

	sent := time.Now()
	ctx, cancel := context.WithDeadline(c.ctx, end)
	got, err := c.r.table.Extend(ctx, c.r.db, c.token, ids, c.r.cfg.lease)
	cancel()

	c.mu.Lock()
	c.extending = false
	if c.stopped {
		c.mu.Unlock()
		return
	}
	var lost []lostMessage
	if err == nil {
		c.extendErr = nil
		c.end = sent.Add(c.r.cfg.lease - leaseGuard(c.r.cfg.lease))
		c.timer.Reset(time.Until(sent.Add(extendEvery(c.r.cfg.lease))))
		var missing []int64
		for _, id := range ids {
			if !slices.Contains(got, id) {
				missing = append(missing, id)
			}
		}
		// A message marked meanwhile is settled: not lost.
		lost = c.loseLocked(c.stillHeld(missing), fmt.Errorf("%w: the message is no longer claimed under this relay's claim (canceled, suspended, or taken back)", outbox.ErrClaimLost))
	} else {
		// Try again before the claim runs out; the timer still ends it.
		c.extendErr = err
		left := time.Until(c.end)
		c.timer.Reset(min(extendEvery(c.r.cfg.lease), max(left/2, c.r.cfg.lease/20), left))
	}
	c.mu.Unlock()
	if err != nil {
		c.r.emit(c.ctx, Event{Kind: EventError, Err: fmt.Errorf("relay: extend the claim of %d messages: %w", len(ids), err)})
		return
	}
	c.r.emit(c.ctx, Event{Kind: EventExtended, Count: len(got)})
	c.report(lost, c.states(lost))
}

// heldIDs returns the ids of the messages whose claim is kept.
func (c *claim) heldIDs() []int64 {
	var ids []int64
	for id, h := range c.held {
		if h.lost == nil && h.state != settled {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// stillHeld returns those of ids whose claim is still kept.
func (c *claim) stillHeld(ids []int64) []int64 {
	var out []int64
	for _, id := range ids {
		if h := c.held[id]; h.lost == nil && h.state != settled {
			out = append(out, id)
		}
	}
	return out
}

// lostMessage is a message whose claim the relay found lost.
type lostMessage struct {
	m     message
	cause error
}

// loseLocked gives up the claim on ids with cause, cancelling the
// context of each sink's call left with lost messages only, and returns
// them for report.
func (c *claim) loseLocked(ids []int64, cause error) []lostMessage {
	var lost []lostMessage
	for _, id := range ids {
		h := c.held[id]
		h.lost = cause
		c.leaveCallLocked(h, cause)
		lost = append(lost, lostMessage{h.m, cause})
	}
	return lost
}

// states reads the states of the lost messages, for their events: nil when
// the read fails (the events then say nothing of the state).
func (c *claim) states(lost []lostMessage) map[int64]lifecycle.State {
	if len(lost) == 0 {
		return nil
	}
	ids := make([]int64, len(lost))
	for i, l := range lost {
		ids[i] = l.m.id
	}
	ctx, cancel := context.WithTimeout(c.ctx, markTimeout)
	defer cancel()
	st, err := c.r.table.States(ctx, c.r.db, ids)
	if err != nil {
		return nil
	}
	return st
}

// report emits an EventClaimLost for each lost message.
func (c *claim) report(lost []lostMessage, states map[int64]lifecycle.State) {
	for _, l := range lost {
		c.r.emit(c.ctx, Event{Kind: EventClaimLost, ID: l.m.env.ID, Topic: l.m.env.Topic, Attempt: l.m.env.Attempt,
			State: states[l.m.id], Err: l.cause})
	}
}

// lost returns why the claim on message id is lost, nil while it is
// held.
func (c *claim) lost(id int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.held[id].lost
}
