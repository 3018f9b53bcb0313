package idempotency

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// heartbeat extends the lease every lease/3 while the handler runs; the first
// beat comes only for handlers that outlive a third of the lease. When the
// lease is lost (stolen, or not extended for a whole lease) it cancels the
// handler's context with a cause wrapping ErrLeaseLost.
//
// The heartbeat calls no user code (observer, logger, route function) from
// its goroutine: stop returns what happened and execute reports it.
type heartbeat struct {
	rq *request

	// Guarded by rq.h.beats.mu.
	prev, next *heartbeat // in the queue
	due        time.Time

	mu        sync.Mutex
	stopped   bool
	lastOK    time.Time
	lost      error // the cause the handler's context was cancelled with
	extendErr error // the last failed extend, when the lease survived it
}

func (hb *heartbeat) start() {
	hb.rq.h.beats.add(hb, hb.lastOK.Add(hb.rq.h.cfg.lease/3))
}

// stop ends the heartbeat and reports a lost lease or failed extends. After
// stop, hb.lost and hb.extendErr are no longer written.
func (hb *heartbeat) stop() {
	hb.mu.Lock()
	hb.stopped = true
	hb.mu.Unlock()
	// A beat that saw stopped false has queued hb again by now (it does so
	// holding hb.mu), so this removes hb for good.
	hb.rq.h.beats.remove(hb)
	switch {
	case hb.lostCause() != nil:
		hb.rq.emit(EventLeaseLost, 0, hb.lost)
	case hb.lastExtendErr() != nil:
		hb.rq.emit(EventStoreError, 0, fmt.Errorf("idempotency: extend: %w", hb.extendErr))
	}
}

func (hb *heartbeat) lostCause() error {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	return hb.lost
}

func (hb *heartbeat) lastExtendErr() error {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	return hb.extendErr
}

// beat extends the lease and queues the next beat. It runs in a goroutine of
// its own, started by heartbeats.fire.
func (hb *heartbeat) beat() {
	hb.mu.Lock()
	stopped := hb.stopped
	hb.mu.Unlock()
	if stopped {
		return
	}
	rq := hb.rq
	lease := rq.h.cfg.lease
	err := rq.h.store.Extend(&rq.detached, rq.acq.Key, rq.acq.Token, lease)
	hb.mu.Lock()
	defer hb.mu.Unlock()
	if hb.stopped {
		return
	}
	now := time.Now()
	switch {
	case err == nil:
		hb.lastOK = now
		rq.h.beats.add(hb, now.Add(lease/3))
	case errors.Is(err, ErrLeaseLost):
		hb.stopped, hb.lost = true, err
		rq.ctx.lose(err)
	case now.Sub(hb.lastOK) >= lease:
		hb.stopped = true
		hb.lost = fmt.Errorf("%w: heartbeat failed for longer than the lease: %v", ErrLeaseLost, err)
		rq.ctx.lose(hb.lost)
	default:
		hb.extendErr = err
		next := lease / 3
		if left := lease - now.Sub(hb.lastOK); left < next {
			next = left
		}
		rq.h.beats.add(hb, now.Add(next))
	}
}

// heartbeats runs the heartbeats of one middleware's handlers from one timer,
// which fires when the earliest is due. Its zero value is ready to use.
//
// A timer per request cost every first execution a runtime timer insertion,
// which often wakes an idle thread: in BenchmarkMiddlewareRedisPaired that was
// several microseconds per request. The handlers of one middleware share one
// lease, so their heartbeats fall due in the order they were queued and the
// queue needs no heap: a new heartbeat joins at the back, and the timer,
// already set for the front, is left alone. Only a failed extend retries
// sooner than a full period, and its heartbeat is inserted in order.
type heartbeats struct {
	mu         sync.Mutex
	head, tail *heartbeat
	timer      *time.Timer
	armedAt    time.Time // when the timer runs fire; zero: not set
}

// add queues hb to beat at due. Callers hold hb.mu or own hb alone.
func (q *heartbeats) add(hb *heartbeat, due time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	hb.due = due
	at := q.tail // hb goes after at
	for at != nil && at.due.After(due) {
		at = at.prev
	}
	hb.prev = at
	if at == nil {
		hb.next, q.head = q.head, hb
	} else {
		hb.next, at.next = at.next, hb
	}
	if hb.next == nil {
		q.tail = hb
	} else {
		hb.next.prev = hb
	}
	if q.armedAt.IsZero() || due.Before(q.armedAt) {
		q.arm(due)
	}
}

// remove takes hb out of the queue, if it is there.
func (q *heartbeats) remove(hb *heartbeat) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.holds(hb) {
		q.unlink(hb)
	}
}

// holds reports whether hb is in the queue. q.mu is held.
func (q *heartbeats) holds(hb *heartbeat) bool { return hb.prev != nil || q.head == hb }

// unlink takes hb, which is in the queue, out of it. q.mu is held.
func (q *heartbeats) unlink(hb *heartbeat) {
	if hb.prev == nil {
		q.head = hb.next
	} else {
		hb.prev.next = hb.next
	}
	if hb.next == nil {
		q.tail = hb.prev
	} else {
		hb.next.prev = hb.prev
	}
	hb.prev, hb.next = nil, nil
}

// arm sets the timer to run fire at due. q.mu is held.
func (q *heartbeats) arm(due time.Time) {
	d := time.Until(due)
	if q.timer == nil {
		q.timer = time.AfterFunc(d, q.fire)
	} else {
		q.timer.Reset(d)
	}
	q.armedAt = due
}

// fire starts a beat for every heartbeat that is due, each in a goroutine of
// its own (an extend is a store round trip), and sets the timer for the next.
// The timer is left unset when the queue is empty, so an idle middleware
// holds no timer.
func (q *heartbeats) fire() {
	now := time.Now()
	var due *heartbeat // a chain through next
	q.mu.Lock()
	for q.head != nil && !q.head.due.After(now) {
		hb := q.head
		q.unlink(hb)
		hb.next, due = due, hb
	}
	q.armedAt = time.Time{}
	if q.head != nil {
		q.arm(q.head.due)
	}
	q.mu.Unlock()
	for due != nil {
		hb := due
		due, hb.next = hb.next, nil
		go hb.beat()
	}
}
