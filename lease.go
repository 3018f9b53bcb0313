package idempotency

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// leaseGuard is how much earlier than the store the middleware counts a
// lease as over: a tenth of it. It covers the lateness of a timer on a busy
// machine and the difference between the rates of the local clock and the
// store's, so the handler's context is cancelled before any other request
// can steal the record.
func leaseGuard(length time.Duration) time.Duration { return length / 10 }

// heartbeat is the interval of the heartbeat: a lease is extended a third
// of a lease after it was taken or last extended, so that a failed extend
// leaves time for another before the lease runs out. It is also the time
// the store calls made outside the heartbeat are given (a release, a
// transaction's begin, and at least that for the calls after the handler):
// as long as the heartbeat gives one extend.
func heartbeat(length time.Duration) time.Duration { return length / 3 }

// minLeaseToStart is the part of a lease that must be left for the handler
// to start: an acquire that took longer than half the lease (a stalled
// store, a client library retrying) is not used.
func minLeaseToStart(length time.Duration) time.Duration { return length / 2 }

// lease is the middleware's view of the lease one request holds while its
// handler runs. The view is conservative: it counts the lease from the moment
// before the call that took or extended it was sent, never from the reply,
// so it ends no later than the store's lease does, and a guard before it.
//
// A heartbeat extends the lease a third of a lease after it was taken or last
// extended (a handler that returns sooner costs no store call); each extend
// is bounded by the time the lease has left. When the store says the lease
// was lost, or the lease runs out without a successful extend, the handler's
// context is cancelled with a cause wrapping ErrLeaseLost.
//
// The heartbeat runs on the timer's goroutine and calls no user code
// (observer, logger, route function): stop returns what happened and the
// request reports it.
type lease struct {
	store      Store
	ctx        context.Context // for store calls: the request's values, not its cancellation
	key, token string
	length     time.Duration
	lose       context.CancelCauseFunc // cancels the handler's context

	mu        sync.Mutex
	end       time.Time   // when the conservative lease runs out
	timer     *time.Timer // the next beat; while an extend is out, the end
	extending bool
	stopped   bool
	lost      error // the cause the handler's context was cancelled with
	extendErr error // the last failed extend, when the lease survived it
}

// start counts the lease from sent, the moment before the acquire that took
// it was sent, and schedules the first beat.
func (l *lease) start(sent time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.end = sent.Add(l.length - leaseGuard(l.length))
	l.timer = time.AfterFunc(time.Until(sent.Add(heartbeat(l.length))), l.beat)
}

// beat extends the lease, or ends it when it has run out.
func (l *lease) beat() {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return
	}
	now := time.Now()
	if !now.Before(l.end) {
		err := fmt.Errorf("%w: the lease ran out before an extend succeeded", ErrLeaseLost)
		if l.extendErr != nil {
			err = fmt.Errorf("%w (last extend: %v)", err, l.extendErr)
		}
		l.loseLocked(err)
		l.mu.Unlock()
		return
	}
	if l.extending { // the timer stands for the end while an extend is out
		l.timer.Reset(l.end.Sub(now))
		l.mu.Unlock()
		return
	}
	l.extending = true
	end := l.end
	l.timer.Reset(end.Sub(now)) // should the extend outlast the lease
	l.mu.Unlock()

	sent := time.Now()
	ctx, cancel := context.WithDeadline(l.ctx, end)
	err := l.store.Extend(ctx, l.key, l.token, l.length)
	cancel()

	l.mu.Lock()
	defer l.mu.Unlock()
	l.extending = false
	if l.stopped {
		return
	}
	switch {
	case err == nil:
		l.end = sent.Add(l.length - leaseGuard(l.length))
		l.timer.Reset(time.Until(sent.Add(heartbeat(l.length))))
	case errors.Is(err, ErrLeaseLost):
		l.loseLocked(err)
	default:
		// Try again before the lease runs out; the timer still ends it.
		l.extendErr = err
		left := time.Until(l.end)
		l.timer.Reset(min(heartbeat(l.length), max(left/2, l.length/20), left))
	}
}

// loseLocked cancels the handler's context with cause. l.mu is held.
func (l *lease) loseLocked(cause error) {
	l.stopped = true
	l.lost = cause
	l.timer.Stop()
	l.lose(cause)
}

// stop ends the heartbeat without waiting for an extend that is out (its
// result is ignored) and reports a lost lease, or the last failed extend of
// a lease that survived it.
func (l *lease) stop() (lost, extendErr error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopped = true
	l.timer.Stop()
	return l.lost, l.extendErr
}

// storeDeadline bounds the store calls that follow the handler (complete or
// release, with their retries): the end of the lease as the middleware
// counts it, and at least a third of a lease from now. A later call could
// still land if nobody took the record over, but the client would wait
// for it.
func (l *lease) storeDeadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return later(l.end, time.Now().Add(heartbeat(l.length)))
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
