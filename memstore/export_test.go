package memstore

import "hash/maphash"

// Sweep runs one purge pass now, as the background sweep does.
func (s *Store) Sweep() { s.purgeAll() }

// Bytes returns the byte total that WithMaxBytes bounds.
func (s *Store) Bytes() int64 { return s.bytes.Load() }

// WatchedKeys returns the number of keys with registered waiters.
func (s *Store) WatchedKeys() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.watchers)
		sh.mu.Unlock()
	}
	return n
}

// ShardOf returns the index of key's shard.
func (s *Store) ShardOf(key string) int {
	return int(maphash.String(s.seed, key) % shardCount)
}
