package sqlitestore

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/go-idempotency/idempotency"
)

// Watch implements idempotency.Store. The channel is closed by the
// Store's own Complete, Release and Tx.Complete of key, after their COMMIT,
// and by Close. A complete or release by another process (or another
// Store on the same file) wakes it only with WithPollInterval: Watch then
// reads which token holds the record in progress, and the Store's poller
// closes the channel once, at one of its polls, the record is no longer in
// progress under that token (completed, released, stolen or expired; or,
// when none held it, once one does). Without polling, Watch reads nothing.
// stop removes the waiter; it may be called more than once.
func (s *Store) Watch(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if s.closed.Load() {
		return nil, nil, idempotency.ErrStoreClosed
	}
	if err := checkText("key", key); err != nil {
		return nil, nil, err
	}
	if err := context.Cause(ctx); err != nil {
		return nil, nil, err
	}
	w := &waiter{ch: make(chan struct{})}
	if s.cfg.pollInterval > 0 {
		r, err := scanRecord(s.stmt.read.QueryRowContext(ctx, key))
		if err != nil && !isCorrupt(err) {
			return nil, nil, opError("watch", key, err)
		}
		w.holder = holder(r, s.now())
	}
	if !s.hub.add(key, w) {
		return nil, nil, idempotency.ErrStoreClosed
	}
	var once sync.Once
	return w.ch, func() { once.Do(func() { s.hub.remove(key, w) }) }, nil
}

// holder is the token that holds r in progress at now, or "" when none
// does (no record, an expired or COMPLETE one, a row that is not a
// record). Tokens are never empty.
func holder(r *record, now int64) string {
	if r.live(now) && r.state == stateInProgress {
		return r.token
	}
	return ""
}

// hub holds the Store's waiters by key.
type hub struct {
	mu      sync.Mutex
	closed  bool
	waiters map[string]map[*waiter]struct{}
}

type waiter struct {
	ch    chan struct{}
	fired bool
	// holder is the token that held the record in progress when Watch
	// read it (with polling): the poller wakes the waiter once another
	// token, or none, holds it.
	holder string
}

func (w *waiter) fire() {
	if !w.fired {
		w.fired = true
		close(w.ch)
	}
}

func (h *hub) init() { h.waiters = make(map[string]map[*waiter]struct{}) }

// add registers w on key; false once the hub is closed.
func (h *hub) add(key string, w *waiter) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	ws := h.waiters[key]
	if ws == nil {
		ws = make(map[*waiter]struct{})
		h.waiters[key] = ws
	}
	ws[w] = struct{}{}
	return true
}

func (h *hub) remove(key string, w *waiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ws := h.waiters[key]
	delete(ws, w)
	if len(ws) == 0 {
		delete(h.waiters, key)
	}
}

// wake closes the channels of key's waiters and forgets them: a later
// Watch waits for a later change.
func (h *hub) wake(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.waiters[key] {
		w.fire()
	}
	delete(h.waiters, key)
}

// close wakes every waiter; later Watch calls fail.
func (h *hub) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for _, ws := range h.waiters {
		for w := range ws {
			w.fire()
		}
	}
	clear(h.waiters)
}

// keys returns the watched keys.
func (h *hub) keys() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	keys := make([]string, 0, len(h.waiters))
	for k := range h.waiters {
		keys = append(keys, k)
	}
	return keys
}

// polled wakes the waiters of keys whose record's holder (holders[key],
// "" when absent) is no longer the one they saw.
func (h *hub) polled(keys []string, holders map[string]string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, k := range keys {
		ws := h.waiters[k]
		for w := range ws {
			if w.holder != holders[k] {
				w.fire()
				delete(ws, w)
			}
		}
		if len(ws) == 0 {
			delete(h.waiters, k)
		}
	}
}

// pollBatch bounds the keys one poll statement reads.
const pollBatch = 500

// pollLoop is the poller (WithPollInterval): every interval, it reads the
// holders of the watched records, pollBatch keys per statement.
func (s *Store) pollLoop() {
	defer s.bg.Done()
	t := time.NewTicker(s.cfg.pollInterval)
	defer t.Stop()
	for {
		select {
		case <-s.quit:
			return
		case <-t.C:
		}
		keys := s.hub.keys()
		for len(keys) > 0 {
			n := min(len(keys), pollBatch)
			s.poll(keys[:n])
			keys = keys[n:]
		}
	}
}

// poll reads the holders of keys and wakes the waiters whose holder
// changed. A failed poll wakes nobody: the waiters re-check on their own
// when the holder's lease runs out.
func (s *Store) poll(keys []string) {
	ctx, cancel := context.WithTimeout(context.Background(), max(s.cfg.pollInterval, time.Second))
	defer cancel()
	list, err := json.Marshal(keys)
	if err != nil {
		return
	}
	rows, err := s.stmt.poll.QueryContext(ctx, string(list))
	if err != nil {
		return
	}
	defer rows.Close()
	now := s.now()
	holders := make(map[string]string, len(keys))
	for rows.Next() {
		var key, state, token, leaseUntil, ttlUntil any
		if err := rows.Scan(&key, &state, &token, &leaseUntil, &ttlUntil); err != nil {
			return
		}
		k, _ := key.(string)
		r := &record{}
		var ok [4]bool
		r.state, ok[0] = text(state)
		r.token, ok[1] = text(token)
		r.leaseUntil, ok[2] = leaseUntil.(int64)
		r.ttlUntil, ok[3] = ttlUntil.(int64)
		if ok == [4]bool{true, true, true, true} {
			holders[k] = holder(r, now)
		}
	}
	if rows.Err() != nil {
		return
	}
	s.hub.polled(keys, holders)
}
