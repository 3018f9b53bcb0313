package memstore

import (
	"math"
	"sync"
	"unsafe"
)

// shardCount is the number of shards; a power of two.
const shardCount = 64

type shardState struct {
	mu       sync.Mutex
	records  map[string]record
	watchers map[string]*watchers
	// nextPurge is no later than the earliest purgeAt of the shard's
	// records, so a purge before it can skip the shard.
	nextPurge instant
}

// shard is one lock domain, padded so neighbouring shards do not share a
// cache line.
type shard struct {
	shardState
	_ [128 - unsafe.Sizeof(shardState{})%128]byte
}

// noteDeadline keeps nextPurge no later than at. Callers hold mu.
func (sh *shard) noteDeadline(at instant) {
	if at < sh.nextPurge {
		sh.nextPurge = at
	}
}

// purge deletes the records that are absent at now and returns how many it
// deleted. Callers hold mu.
func (sh *shard) purge(now instant) int {
	if now < sh.nextPurge {
		return 0
	}
	n := 0
	next := instant(math.MaxInt64)
	for key, rec := range sh.records {
		at := rec.purgeAt()
		if now >= at {
			delete(sh.records, key)
			n++
		} else if at < next {
			next = at
		}
	}
	sh.nextPurge = next
	return n
}
