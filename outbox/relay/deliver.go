package relay

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency/outbox"
)

// The codes that open a message's last_error ("<code>: <message>"), as
// idemctl outbox shows it.
const (
	// CodePublishFailed: the sink returned an error.
	CodePublishFailed = "publish_failed"
	// CodeSinkPanicked: the sink panicked; the relay recovered.
	CodeSinkPanicked = "sink_panicked"
	// CodeClaimExpired: the claim ran out before its relay marked an
	// outcome (it died, stalled or lost the database).
	CodeClaimExpired = "claim_expired"
)

// errClaimExpired is the Err of an EventDead for a claim that ran out.
var errClaimExpired = errors.New("relay: " + CodeClaimExpired + ": the claim ran out before its relay marked an outcome")

// markTimeout bounds each mark (done, retry, release): a mark that does
// not land leaves the message claimed until its lease runs out.
const markTimeout = 10 * time.Second

// maxErrorLen bounds the error kept in last_error, in bytes.
const maxErrorLen = 2048

// claim is one claim statement's hold on its messages.
type claim struct {
	token string
	// late is when a message is no longer presented: half the lease after
	// the claim was sent, on the relay's clock.
	late time.Time
	// end is when every publish must have ended: a tenth of the lease
	// before the lease's end, counted from before the claim was sent.
	end time.Time
}

// claimed is a message as the claim statement returned it.
type claimed struct {
	id  int64
	env outbox.Envelope
}

// round claims a batch and presents it, and returns how many messages it
// claimed.
func (r *Relay) round(ctx context.Context) (int, error) {
	var b [16]byte
	rand.Read(b[:])
	sent := time.Now()
	c := &claim{
		token: hex.EncodeToString(b[:]),
		late:  sent.Add(r.cfg.lease / 2),
		end:   sent.Add(r.cfg.lease - r.cfg.lease/10),
	}
	rows, err := r.pool.Query(ctx, r.sql.claim, r.cfg.batch, c.token, r.cfg.name, r.cfg.lease)
	if err != nil {
		return 0, fmt.Errorf("relay: claim: %w", err)
	}
	msgs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (claimed, error) {
		var m claimed
		var key string
		var seq, attempts int
		err := row.Scan(&m.id, &key, &seq, &m.env.Topic, &m.env.Payload, &m.env.Headers, &m.env.OrderingKey, &attempts, &m.env.EnqueuedAt)
		m.env.ID, m.env.Attempt = outbox.ID(key, seq), attempts+1
		return m, err
	})
	if err != nil {
		return 0, fmt.Errorf("relay: claim: %w", err)
	}
	if len(msgs) == 0 {
		return 0, nil
	}
	slices.SortFunc(msgs, func(a, b claimed) int { return cmp.Compare(a.id, b.id) })
	r.emit(ctx, Event{Kind: EventClaimed, Count: len(msgs)})
	r.present(ctx, c, msgs)
	return len(msgs), nil
}

// confirmed is a message its sink confirmed, waiting for its done mark.
type confirmed struct {
	id int64
	e  Event // its EventPublished, but for the mark's outcome
}

// present publishes msgs, WithConcurrency at a time, marks those the sink
// confirmed done in one statement once the batch has been presented, and
// hands back those whose turn came too late or after ctx ended. The marks
// of a batch wait for its end: one commit per batch rather than one per
// message (the relay's throughput over a plain publishing loop:
// BENCHMARKS.md), at the cost that a relay dying mid-batch has its
// batch's confirmed messages published again after the claim lease, as
// one dying between a confirm and its mark always has.
func (r *Relay) present(ctx context.Context, c *claim, msgs []claimed) {
	var (
		mu   sync.Mutex
		back []int64
		done []confirmed
		wg   sync.WaitGroup
	)
	work := make(chan claimed)
	for range min(r.cfg.concurrency, len(msgs)) {
		wg.Go(func() {
			for m := range work {
				if ctx.Err() != nil || time.Now().After(c.late) {
					mu.Lock()
					back = append(back, m.id)
					mu.Unlock()
					continue
				}
				if e, ok := r.deliver(ctx, c, m); ok {
					mu.Lock()
					done = append(done, confirmed{m.id, e})
					mu.Unlock()
				}
			}
		})
	}
	for _, m := range msgs {
		work <- m
	}
	close(work)
	wg.Wait()
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markTimeout)
	defer cancel()
	r.markDone(ctx, mctx, c, done)
	if len(back) == 0 {
		return
	}
	if _, err := r.pool.Exec(mctx, r.sql.release, back, c.token); err != nil {
		r.emit(ctx, Event{Kind: EventError, Err: fmt.Errorf("relay: release %d messages: %w", len(back), err)})
	}
}

// markDone marks the confirmed messages done, in mctx, and reports each:
// published, or fenced when its claim had been taken back meanwhile.
func (r *Relay) markDone(ctx, mctx context.Context, c *claim, done []confirmed) {
	if len(done) == 0 {
		return
	}
	ids := make([]int64, len(done))
	for i, d := range done {
		ids[i] = d.id
	}
	rows, err := r.pool.Query(mctx, r.sql.done, ids, c.token)
	var marked []int64
	if err == nil {
		marked, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	}
	if err != nil {
		r.emit(ctx, Event{Kind: EventError, Err: fmt.Errorf("relay: mark %d messages done (published; they are published again once their claim runs out): %w", len(done), err)})
		return
	}
	for _, d := range done {
		if slices.Contains(marked, d.id) {
			d.e.Kind = EventPublished
		} else {
			d.e.Kind, d.e.Published, d.e.Age = EventFenced, true, 0
		}
		r.emit(ctx, d.e)
	}
}

// deliver presents one message to the sink. When the sink confirmed it,
// deliver returns its event (its age taken at the confirm), for markDone;
// otherwise it marks the failure itself, reports it, and returns false.
func (r *Relay) deliver(ctx context.Context, c *claim, m claimed) (Event, bool) {
	pctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), c.end)
	start := time.Now()
	err := publish(pctx, r.sink, m.env)
	took := time.Since(start)
	cancel()

	e := Event{ID: m.env.ID, Topic: m.env.Topic, Attempt: m.env.Attempt, Duration: took}
	if err == nil {
		e.Age = time.Since(m.env.EnqueuedAt)
		return e, true
	}
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markTimeout)
	defer cancel()
	wait := backoff(m.env.Attempt, r.cfg.backoffMin, r.cfg.backoffMax, r.random)
	var status string
	merr := r.pool.QueryRow(mctx, r.sql.retry, m.id, c.token, r.cfg.maxAttempts, wait, lastError(err)).Scan(&status)
	switch {
	case errors.Is(merr, pgx.ErrNoRows):
		e.Kind = EventFenced
	case merr != nil:
		e.Kind, e.Err = EventError, fmt.Errorf("relay: mark %s failed (%v): %w", m.env.ID, err, merr)
	case status == outbox.StatusDead:
		e.Kind, e.Err = EventDead, err
	default:
		e.Kind, e.Err, e.Backoff = EventRetried, err, wait
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

// lastError is err as last_error keeps it: "<code>: <message>", valid
// UTF-8 without NUL bytes, at most maxErrorLen bytes.
func lastError(err error) string {
	code := CodePublishFailed
	if errors.As(err, new(panicError)) {
		code = CodeSinkPanicked
	}
	s := strings.ToValidUTF8(strings.ReplaceAll(code+": "+err.Error(), "\x00", ""), "\uFFFD")
	if len(s) > maxErrorLen {
		s = s[:maxErrorLen]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
	}
	return s
}
