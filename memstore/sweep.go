package memstore

import (
	"math"
	"time"
)

// sweep purges expired records every interval until Close.
func (s *Store) sweep(interval time.Duration) {
	defer close(s.swept)
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-s.quit:
			return
		case <-ticker.C:
			s.purgeAll()
		}
	}
}

// purgeAll purges expired records shard by shard, holding one shard's lock
// at a time. Shards with nothing expired are skipped after a glance.
func (s *Store) purgeAll() {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		if !s.closed.Load() {
			s.purge(sh, s.now())
		}
		sh.mu.Unlock()
	}
}

// purge deletes the records of sh that are absent at now and takes them
// off the totals. Callers hold sh.mu.
func (s *Store) purge(sh *shard, now instant) {
	if now < sh.nextPurge {
		return
	}
	next := instant(math.MaxInt64)
	for key, rec := range sh.records {
		if at := rec.purgeAt(); now >= at {
			delete(sh.records, key)
			s.forget(rec.held)
		} else if at < next {
			next = at
		}
	}
	sh.nextPurge = next
}

// noteDeadline keeps nextPurge no later than at. Callers hold mu.
func (sh *shard) noteDeadline(at instant) {
	if at < sh.nextPurge {
		sh.nextPurge = at
	}
}
