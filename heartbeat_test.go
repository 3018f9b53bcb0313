package idempotency

import (
	"testing"
	"time"
)

// queueOrder returns the dues of q's heartbeats, checking that the links
// agree in both directions.
func queueOrder(t *testing.T, q *heartbeats) []time.Time {
	t.Helper()
	var dues []time.Time
	var prev *heartbeat
	for hb := q.head; hb != nil; hb = hb.next {
		if hb.prev != prev || !q.holds(hb) {
			t.Fatalf("broken link at %v", hb.due)
		}
		dues = append(dues, hb.due)
		prev = hb
	}
	if q.tail != prev {
		t.Fatal("tail is not the last heartbeat")
	}
	return dues
}

// TestHeartbeatsQueue: heartbeats are kept in due order whatever order they
// are added in, the timer is set for the earliest, and remove unlinks from
// the front, the middle and the back.
func TestHeartbeatsQueue(t *testing.T) {
	var q heartbeats
	base := time.Now().Add(time.Hour) // the timer must not fire
	defer func() {
		q.mu.Lock()
		q.timer.Stop()
		q.mu.Unlock()
	}()
	hbs := make([]*heartbeat, 5)
	for i, d := range []int{3, 5, 1, 4, 2} { // minutes after base
		hbs[i] = &heartbeat{}
		q.add(hbs[i], base.Add(time.Duration(d)*time.Minute))
	}
	got := queueOrder(t, &q)
	for i := range got {
		if want := base.Add(time.Duration(i+1) * time.Minute); !got[i].Equal(want) {
			t.Fatalf("position %d: due %v, want %v", i, got[i].Sub(base), want.Sub(base))
		}
	}
	if !q.armedAt.Equal(base.Add(time.Minute)) {
		t.Fatalf("timer set for %v, want the earliest due", q.armedAt.Sub(base))
	}
	// A due equal to the last one goes behind it.
	last := &heartbeat{}
	q.add(last, base.Add(5*time.Minute))
	if q.tail != last {
		t.Fatal("equal due not queued at the back")
	}
	for _, i := range []int{2, 0, 1} { // front (1 min), middle (3 min), then 5 min
		q.remove(hbs[i])
		if q.holds(hbs[i]) || hbs[i].prev != nil || hbs[i].next != nil {
			t.Fatalf("removed heartbeat %d still linked", i)
		}
	}
	q.remove(hbs[0]) // twice: nothing happens
	if got := queueOrder(t, &q); len(got) != 3 || !got[0].Equal(base.Add(2*time.Minute)) || q.tail != last {
		t.Fatalf("after removals: %d queued, tail %v", len(got), q.tail == last)
	}
}

// TestHeartbeatsFire: fire takes every due heartbeat out of the queue, leaves
// the others, and sets the timer for the next; with nothing queued it leaves
// the timer unset.
func TestHeartbeatsFire(t *testing.T) {
	var q heartbeats
	now := time.Now()
	stopped := func() *heartbeat { return &heartbeat{stopped: true} } // their beats return at once
	past1, past2, future := stopped(), stopped(), stopped()
	q.mu.Lock()
	q.timer = time.AfterFunc(time.Hour, func() {}) // fire is called by hand
	q.mu.Unlock()
	defer q.timer.Stop()
	q.add(future, now.Add(time.Hour))
	q.add(past1, now.Add(-time.Second))
	q.add(past2, now)
	q.fire()
	if q.holds(past1) || q.holds(past2) || !q.holds(future) || q.head != future || q.tail != future {
		t.Fatalf("queued after fire: past %v %v, future %v", q.holds(past1), q.holds(past2), q.holds(future))
	}
	if !q.armedAt.Equal(future.due) {
		t.Fatal("timer not set for the remaining heartbeat")
	}
	q.remove(future)
	q.fire()
	if !q.armedAt.IsZero() || q.head != nil {
		t.Fatal("timer set with an empty queue")
	}
}
