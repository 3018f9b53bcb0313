package memstore

import (
	"math"
	"sync"
	"unsafe"

	"github.com/go-idempotency/idempotency"
)

// shardCount is the number of shards, chosen by the low shardBits bits of
// a key's hash.
const (
	shardBits  = 6
	shardCount = 1 << shardBits
)

type shardState struct {
	mu       sync.Mutex
	records  map[string]record
	watchers map[string]*watchers
	// done indexes the COMPLETE records that duplicates have asked for
	// since they were completed, so that later duplicates are answered
	// without taking mu (see published). The second duplicate publishes
	// the record; Complete and the first duplicate do not, which keeps
	// first executions, and records duplicated once or never, free of the
	// entry's allocation.
	done published
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

// completed is what Acquire needs of a COMPLETE record: 56 bytes, so the
// allocator gives it a 64-byte cache line of its own, which nothing else
// writes while readers on several cores read it.
type completed struct {
	key         string
	hash        uint64 // of key, as Store.hash computes it
	fingerprint string
	resp        *idempotency.Response
	until       instant // the record's ttlUntil
}

// publish makes the COMPLETE record rec of key, whose hash is h, readable
// through done, with its response decoded once for every later duplicate,
// and returns that response. Callers hold mu.
func (sh *shard) publish(key string, h uint64, rec *record) (*idempotency.Response, error) {
	if c := sh.done.get(key, h); c != nil {
		return c.resp, nil
	}
	resp, err := payload{rec.meta, rec.body}.response()
	if err != nil {
		return nil, err
	}
	sh.done.put(&completed{key: key, hash: h, fingerprint: rec.fingerprint, resp: resp, until: rec.ttlUntil})
	return resp, nil
}

// noteDeadline keeps nextPurge no later than at. Callers hold mu.
func (sh *shard) noteDeadline(at instant) {
	if at < sh.nextPurge {
		sh.nextPurge = at
	}
}

// purge deletes the records that are absent at now and returns how many it
// deleted; hash is Store.hash. Callers hold mu.
func (sh *shard) purge(now instant, hash func(string) uint64) int {
	if now < sh.nextPurge {
		return 0
	}
	n := 0
	next := instant(math.MaxInt64)
	for key, rec := range sh.records {
		at := rec.purgeAt()
		if now >= at {
			delete(sh.records, key)
			if rec.complete() && sh.done.live > 0 {
				sh.done.remove(key, hash(key))
			}
			n++
		} else if at < next {
			next = at
		}
	}
	sh.nextPurge = next
	if n > 0 {
		sh.done.shrink()
	}
	return n
}
