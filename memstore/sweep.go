package memstore

import "time"

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
