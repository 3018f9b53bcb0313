package relay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
)

// The codes that open a message's last_error ("<code>: <message>"), as
// idemctl outbox shows it.
const (
	// CodePublishFailed: the sink returned an error.
	CodePublishFailed = "publish_failed"
	// CodeSinkPanicked: the sink panicked; the relay recovered.
	CodeSinkPanicked = "sink_panicked"
	// CodeRefused: the sink refused the message permanently
	// (outbox.Permanent); it is dead.
	CodeRefused = "refused"
	// CodeClaimExpired: the claim ran out before its relay marked an
	// outcome (it died, stalled or lost the database).
	CodeClaimExpired = lifecycle.CodeClaimExpired
	// CodeUnreadable: the relay could not read the message's row (its
	// headers are not a JSON object of strings, a time is infinite, a
	// column is NULL...); it is dead.
	CodeUnreadable = lifecycle.CodeUnreadable
	// CodeCanceled: the message was canceled (outbox.Cancel, idemctl
	// outbox cancel).
	CodeCanceled = lifecycle.CodeCanceled
)

// errClaimExpired is the Err of an EventDead for a claim that ran out.
var errClaimExpired = errors.New("relay: " + CodeClaimExpired + ": the claim ran out before its relay marked an outcome")

// markTimeout bounds each mark (done, retry, release...): a mark that does
// not land leaves the message claimed until its lease runs out.
const markTimeout = 10 * time.Second

// claimBatch claims a batch and sets apart the rows of it that cannot be
// read. It returns nil when nothing was due.
func (r *Relay) claimBatch(ctx context.Context) (*batch, error) {
	var b [16]byte
	rand.Read(b[:])
	token := hex.EncodeToString(b[:])
	sent := time.Now()
	msgs, err := r.table.Claim(ctx, r.db, token, r.cfg.name, r.cfg.lease, r.cfg.batch)
	if err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	if len(msgs) == 0 {
		return nil, nil
	}
	r.emit(ctx, Event{Kind: EventClaimed, Count: len(msgs)})
	var readable []message
	var unreadable []lifecycle.ClaimedMessage
	for _, m := range msgs {
		if m.Err != nil {
			unreadable = append(unreadable, m)
			continue
		}
		readable = append(readable, message{id: m.RowID, env: outbox.Envelope{
			ID: m.ID, Topic: m.Topic, Payload: m.Payload, Headers: m.Headers, OrderingKey: m.OrderingKey,
			Attempt: m.Attempts + 1, EnqueuedAt: m.EnqueuedAt,
		}})
	}
	c := r.newClaim(ctx, token, sent, readable)
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markTimeout)
	r.setApart(ctx, mctx, token, unreadable)
	cancel()
	return &batch{c: c, msgs: readable, results: make([]result, len(readable))}, nil
}

// setApart marks each message whose row the relay could not read dead,
// with the decode error, on its own: the batch's other messages go on.
func (r *Relay) setApart(ctx, mctx context.Context, token string, msgs []lifecycle.ClaimedMessage) {
	for _, m := range msgs {
		e := Event{Kind: EventUnreadable, ID: m.ID, Topic: m.Topic, Attempt: m.Attempts + 1, Err: m.Err}
		mark, err := r.table.Unreadable(mctx, r.db, token, m.RowID, m.Err)
		switch {
		case errors.Is(err, lifecycle.ErrNotClaimed):
			e.Kind = EventFenced
		case err != nil:
			e.Kind, e.Err = EventError, fmt.Errorf("relay: set apart unreadable row %d (%v): %w", m.RowID, m.Err, err)
		default:
			e.Attempt = mark.Attempts
		}
		r.emit(ctx, e)
	}
}

// present presents the batch's messages to the sink and keeps the outcome
// of each in b.results; the marks are mark's. A BatchSink is given the
// batch in one call (PublishBatch), which keeps a window of publications
// waiting for their confirms; any other sink is given one message at a
// time per goroutine, WithConcurrency of them. A message is not presented
// when the claim on it is lost, or too little of the claim is left, or
// Run's context ended.
//
// The presentation (present) and the marks of its outcomes (mark) are
// apart: the sink's call never waits for the database, nor the database
// for the sink.
func (r *Relay) present(ctx context.Context, b *batch) {
	if len(b.msgs) == 0 || ctx.Err() != nil {
		return
	}
	if r.batchSink != nil {
		r.presentBatch(b)
		return
	}
	var wg sync.WaitGroup
	work := make(chan int)
	for range min(r.cfg.concurrency, len(b.msgs)) {
		wg.Go(func() {
			for i := range work {
				m := b.msgs[i]
				if ctx.Err() != nil {
					continue
				}
				pctx, begun := b.c.begin(m.id)
				if len(begun) == 0 {
					continue
				}
				start := time.Now()
				// The local-run hook (local.go): the claim rides on the sink's context.
				err := publish(withLocalRun(pctx, b.c), r.sink, m.env)
				at := time.Now()
				b.c.finish(m.id)
				b.results[i] = result{presented: true, err: err, took: at.Sub(start), at: at}
			}
		})
	}
	for i := range b.msgs {
		work <- i
	}
	close(work)
	wg.Wait()
}

// presentBatch gives the batch's messages to the BatchSink in one call.
func (r *Relay) presentBatch(b *batch) {
	ids := make([]int64, len(b.msgs))
	for i, m := range b.msgs {
		ids[i] = m.id
	}
	pctx, begun := b.c.begin(ids...)
	if len(begun) == 0 {
		return
	}
	// begun keeps the order of ids, a subsequence of b.msgs.
	index := make([]int, 0, len(begun))
	es := make([]outbox.Envelope, 0, len(begun))
	for i, m := range b.msgs {
		if len(index) < len(begun) && begun[len(index)] == m.id {
			index = append(index, i)
			es = append(es, m.env)
		}
	}
	start := time.Now()
	// The local-run hook (local.go): the claim rides on the sink's context.
	errs := publishBatch(withLocalRun(pctx, b.c), r.batchSink, es)
	at := time.Now()
	for j, i := range index {
		b.c.finish(b.msgs[i].id)
		b.results[i] = result{presented: true, err: errs[j], took: at.Sub(start), at: at}
	}
}

// mark takes the edges of the outcomes of a presented batch: settle's for
// each message the sink did not confirm, as it comes; done for those it
// confirmed, in one statement; release for those not presented. Then the
// claim is no longer kept.
func (r *Relay) mark(ctx context.Context, b *batch) {
	defer b.c.close()
	var (
		back []int64
		done []confirmedMessage
	)
	for i, m := range b.msgs {
		res := b.results[i]
		if !res.presented {
			// Handed back, unless the claim on it is lost already.
			if b.c.lost(m.id) == nil {
				back = append(back, m.id)
			}
			continue
		}
		if e, ok := r.settle(ctx, b.c, m, res.err, res.took); ok {
			e.Age = res.at.Sub(m.env.EnqueuedAt)
			done = append(done, confirmedMessage{m.id, e})
		}
	}
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markTimeout)
	defer cancel()
	r.markDone(ctx, mctx, b.c, done)
	r.release(ctx, mctx, b.c, back)
}

// confirmedMessage is a message its sink confirmed, waiting for its done
// mark.
type confirmedMessage struct {
	id int64
	e  Event // its EventPublished, but for the mark's outcome
}

// release hands back the messages of the claim that were not presented.
func (r *Relay) release(ctx, mctx context.Context, c *claim, back []int64) {
	if len(back) == 0 {
		return
	}
	c.settle(back...)
	released, err := r.table.Release(mctx, r.db, c.token, back)
	if err != nil {
		r.emit(ctx, Event{Kind: EventError, Err: fmt.Errorf("relay: release %d messages: %w", len(back), err)})
		return
	}
	if len(released) > 0 {
		r.emit(ctx, Event{Kind: EventReleased, Count: len(released)})
	}
}

// markDone marks the confirmed messages done, in mctx, and reports each:
// published; or, when the claim on it had been lost meanwhile, canceled or
// fenced.
func (r *Relay) markDone(ctx, mctx context.Context, c *claim, done []confirmedMessage) {
	if len(done) == 0 {
		return
	}
	ids := make([]int64, len(done))
	for i, d := range done {
		ids[i] = d.id
	}
	c.settle(ids...)
	marked, err := r.table.Done(mctx, r.db, c.token, ids)
	if err != nil {
		r.emit(ctx, Event{Kind: EventError, Err: fmt.Errorf("relay: mark %d messages done (published; they are published again once their claim runs out): %w", len(done), err)})
		return
	}
	isMarked := make(map[int64]bool, len(marked))
	for _, id := range marked {
		isMarked[id] = true
	}
	var refused []int64
	for _, d := range done {
		if !isMarked[d.id] {
			refused = append(refused, d.id)
		}
	}
	states := r.states(mctx, refused)
	for _, d := range done {
		if isMarked[d.id] {
			d.e.Kind = EventPublished
		} else {
			d.e.Age = 0
			r.refused(&d.e, states[d.id], true)
		}
		r.emit(ctx, d.e)
	}
}

// refused makes e the event of a mark the claim's loss refused: canceled,
// when the message was, or else fenced.
func (r *Relay) refused(e *Event, state lifecycle.State, published bool) {
	e.Kind, e.State, e.Published = EventFenced, state, published
	if state == lifecycle.Canceled {
		e.Kind = EventCanceled
	}
}

// states reads the states of the rows ids, for the events of refused
// marks: empty when the read fails.
func (r *Relay) states(ctx context.Context, ids []int64) map[int64]lifecycle.State {
	if len(ids) == 0 {
		return nil
	}
	st, err := r.table.States(ctx, r.db, ids)
	if err != nil {
		return nil
	}
	return st
}

// settle marks the outcome of one presentation. When the sink confirmed
// the message, settle returns its event (its age taken at the confirm),
// for markDone; otherwise it marks the outcome itself, reports it, and
// returns false:
//
//   - a refusal (outbox.ErrPermanent): dead at once (refuse);
//   - a suspension (outbox.ErrSuspend): suspended, no attempt counted
//     (sink-suspend);
//   - any other error, or a panic: waiting for a retry after a backoff, or
//     dead at the attempt cap (retry).
//
// Each mark is fenced: when the claim on the message was lost meanwhile,
// it changes nothing, and the event says so (fenced, or canceled).
func (r *Relay) settle(ctx context.Context, c *claim, m message, err error, took time.Duration) (Event, bool) {
	e := Event{ID: m.env.ID, Topic: m.env.Topic, Attempt: m.env.Attempt, Duration: took}
	// The local-run hook (local.go): the run's own transaction marked the
	// message done; there is nothing left to mark.
	if ranLocally(err) {
		e.Kind, e.Age = EventPublished, time.Since(m.env.EnqueuedAt)
		r.emit(ctx, e)
		return Event{}, false
	}
	if err == nil {
		e.Age = time.Since(m.env.EnqueuedAt)
		return e, true
	}
	c.settle(m.id) // its mark follows: an extend that no longer finds it then is no loss
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markTimeout)
	defer cancel()
	var mark lifecycle.Mark
	var merr error
	e.Err = err
	switch {
	case errors.Is(err, outbox.ErrPermanent):
		e.Kind = EventRefused
		mark, merr = r.table.Refuse(mctx, r.db, c.token, m.id, lifecycle.ErrorText(CodeRefused, err))
	case errors.Is(err, outbox.ErrSuspend):
		e.Kind, e.Reason = EventSuspended, outbox.SuspendReason(err)
		mark, merr = r.table.SinkSuspend(mctx, r.db, c.token, m.id, e.Reason)
	default:
		wait := backoff(m.env.Attempt, r.cfg.backoffMin, r.cfg.backoffMax, r.random)
		e.Kind, e.Backoff = EventRetried, wait
		mark, merr = r.table.Retry(mctx, r.db, c.token, m.id, r.cfg.maxAttempts, wait, lastError(err))
		if merr == nil && mark.State == lifecycle.Dead {
			e.Kind, e.Backoff = EventDead, 0
		}
	}
	switch {
	case errors.Is(merr, lifecycle.ErrNotClaimed):
		r.refused(&e, r.states(mctx, []int64{m.id})[m.id], false)
	case merr != nil:
		e.Kind, e.Err = EventError, fmt.Errorf("relay: mark %s (%v): %w", m.env.ID, err, merr)
	}
	r.emit(ctx, e)
	return Event{}, false
}

// panicError is a sink's panic, recovered.
type panicError struct{ v any }

func (p panicError) Error() string { return fmt.Sprintf("the sink panicked: %v", p.v) }

// publish calls the sink, recovering a panic as an error.
func publish(ctx context.Context, sink outbox.Sink, e outbox.Envelope) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = panicError{v}
		}
	}()
	return sink.Publish(ctx, e)
}

// publishBatch calls the BatchSink, recovering a panic as an error of each
// envelope, and returns exactly one error per envelope: when the sink
// returns another number, each envelope fails, to be presented again.
func publishBatch(ctx context.Context, sink outbox.BatchSink, es []outbox.Envelope) (errs []error) {
	defer func() {
		if v := recover(); v != nil {
			errs = make([]error, len(es))
			for i := range errs {
				errs[i] = panicError{v}
			}
		}
	}()
	errs = sink.PublishBatch(ctx, es)
	if len(errs) != len(es) {
		err := fmt.Errorf("relay: the sink's PublishBatch returned %d outcomes for %d envelopes", len(errs), len(es))
		errs = make([]error, len(es))
		for i := range errs {
			errs[i] = err
		}
	}
	return errs
}

// lastError is err as last_error keeps it: "<code>: <message>" (see
// lifecycle.Text).
func lastError(err error) string {
	code := CodePublishFailed
	if errors.As(err, new(panicError)) {
		code = CodeSinkPanicked
	}
	return lifecycle.ErrorText(code, err)
}
