// Package outboxtest holds what the tests of the outbox, its relay, idemctl
// and the adapters share: a recording Sink, and a database with pgstore's
// tables on the local PostgreSQL server (see internal/pgtest).
package outboxtest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/outbox"
)

// Delivery is one envelope a Recorder confirmed.
type Delivery struct {
	outbox.Envelope
	// At is when the Recorder confirmed it.
	At time.Time
}

// Recorder is an outbox.Sink that records what it is given: it counts the
// deliveries (confirmed publishes) of each ID, notices an ID or an ordering
// key presented while a publish of it is still running, and fails or hangs
// on demand. It is safe for concurrent use.
type Recorder struct {
	mu         sync.Mutex
	deliveries []Delivery
	byID       map[string]int
	failures   map[string]int // failed presentations by ID
	runningID  map[string]int
	runningKey map[string]int
	overlapID  int
	overlapKey int
	fail       func(outbox.Envelope) error
	hang       func(outbox.Envelope) <-chan struct{}
	changed    chan struct{} // closed and replaced at every delivery or failure
}

// NewRecorder returns a Recorder that confirms everything.
func NewRecorder() *Recorder {
	return &Recorder{
		byID:       map[string]int{},
		failures:   map[string]int{},
		runningID:  map[string]int{},
		runningKey: map[string]int{},
		changed:    make(chan struct{}),
	}
}

// FailWith makes Publish return what fail returns for an envelope, when
// it is not nil (nil fail: confirm everything again).
func (r *Recorder) FailWith(fail func(outbox.Envelope) error) {
	r.mu.Lock()
	r.fail = fail
	r.mu.Unlock()
}

// HangWith makes Publish of an envelope for which hang returns a channel
// wait until that channel is closed, whatever its context says, and then
// go on (to fail or confirm). A nil channel does not hang.
func (r *Recorder) HangWith(hang func(outbox.Envelope) <-chan struct{}) {
	r.mu.Lock()
	r.hang = hang
	r.mu.Unlock()
}

// Publish implements outbox.Sink.
func (r *Recorder) Publish(ctx context.Context, e outbox.Envelope) error {
	r.mu.Lock()
	if r.runningID[e.ID] > 0 {
		r.overlapID++
	}
	if r.runningKey[e.OrderingKey] > 0 {
		r.overlapKey++
	}
	r.runningID[e.ID]++
	r.runningKey[e.OrderingKey]++
	fail, hang := r.fail, r.hang
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.runningID[e.ID]--
		r.runningKey[e.OrderingKey]--
		r.mu.Unlock()
	}()

	if hang != nil {
		if ch := hang(e); ch != nil {
			<-ch
		}
	}
	var err error
	if fail != nil {
		err = fail(e)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.failures[e.ID]++
	} else {
		r.deliveries = append(r.deliveries, Delivery{Envelope: e, At: time.Now()})
		r.byID[e.ID]++
	}
	close(r.changed)
	r.changed = make(chan struct{})
	return err
}

// Count returns how many times id was delivered.
func (r *Recorder) Count(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byID[id]
}

// Failures returns how many presentations of id failed.
func (r *Recorder) Failures(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failures[id]
}

// Deliveries returns the deliveries so far, in the order they were
// confirmed.
func (r *Recorder) Deliveries() []Delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Delivery(nil), r.deliveries...)
}

// Counts returns the deliveries of each ID delivered so far.
func (r *Recorder) Counts() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := make(map[string]int, len(r.byID))
	for id, n := range r.byID {
		m[id] = n
	}
	return m
}

// Overlaps returns how many presentations began while a publish of the same
// ID, and of the same ordering key, was still running.
func (r *Recorder) Overlaps() (ids, keys int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.overlapID, r.overlapKey
}

// ErrTimeout is returned by Await when its condition did not hold in time.
var ErrTimeout = errors.New("outboxtest: the condition did not hold in time")

// Await waits until cond holds, checking it at every delivery or failure,
// for at most d.
func (r *Recorder) Await(d time.Duration, cond func(*Recorder) bool) error {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		changed := r.changed
		r.mu.Unlock()
		if cond(r) {
			return nil
		}
		select {
		case <-changed:
		case <-deadline.C:
			if cond(r) {
				return nil
			}
			return ErrTimeout
		}
	}
}

// AwaitIDs waits until each of ids was delivered at least once, for at
// most d.
func (r *Recorder) AwaitIDs(d time.Duration, ids ...string) error {
	return r.Await(d, func(r *Recorder) bool {
		for _, id := range ids {
			if r.Count(id) == 0 {
				return false
			}
		}
		return true
	})
}

// ExpectOnceEach fails t unless every one of ids was delivered exactly once
// and nothing else was.
func (r *Recorder) ExpectOnceEach(t testing.TB, ids []string) {
	t.Helper()
	counts := r.Counts()
	for _, id := range ids {
		if counts[id] != 1 {
			t.Errorf("%s delivered %d times, want 1", id, counts[id])
		}
		delete(counts, id)
	}
	for id, n := range counts {
		t.Errorf("%s delivered %d times, and was never enqueued", id, n)
	}
}
