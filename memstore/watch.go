package memstore

import "context"

// watchers is the subscription of the waiters on one key: ch is closed on
// the key's next Complete or Release, and n counts the waiters that have not
// called stop.
type watchers struct {
	ch chan struct{}
	n  int
}

// Watch implements idempotency.Store. The channel is closed by Complete or
// Release of key (or by Close) with no polling. stop removes the waiter's
// registration, and the key's entry once no waiter is left; it may be called
// more than once.
func (s *Store) Watch(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	sh := s.shard(key)
	if err := s.lock(sh); err != nil {
		return nil, nil, err
	}
	defer sh.mu.Unlock()
	w := sh.watchers[key]
	if w == nil {
		if sh.watchers == nil {
			sh.watchers = make(map[string]*watchers)
		}
		w = &watchers{ch: make(chan struct{})}
		sh.watchers[key] = w
	}
	w.n++
	stopped := false
	stop := func() {
		sh.mu.Lock()
		defer sh.mu.Unlock()
		if stopped {
			return
		}
		stopped = true
		// After a wake the key's entry is gone or belongs to later waiters.
		if sh.watchers[key] == w {
			w.n--
			if w.n == 0 {
				delete(sh.watchers, key)
			}
		}
	}
	return w.ch, stop, nil
}

// wake closes the channel of key's waiters. Callers hold sh.mu.
func (sh *shard) wake(key string) {
	if w := sh.watchers[key]; w != nil {
		close(w.ch)
		delete(sh.watchers, key)
	}
}

// wakeAll closes every waiter's channel. Callers hold sh.mu.
func (sh *shard) wakeAll() {
	for key, w := range sh.watchers {
		close(w.ch)
		delete(sh.watchers, key)
	}
}
