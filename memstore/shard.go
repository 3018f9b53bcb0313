package memstore

import (
	"math"
	"sync"
	"unsafe"

	"github.com/go-idempotency/idempotency"
)

// shardCount is the number of shards; a power of two.
const shardCount = 64

type shardState struct {
	mu       sync.Mutex
	records  map[string]record
	watchers map[string]*watchers
	// done holds a copy (key to *completed) of each COMPLETE record that
	// an Acquire has found since it was completed, so that later duplicates
	// are answered without taking mu: reading it writes nothing that other
	// cores read, so replays scale with the cores. Entries are made on the
	// first duplicate, not by Complete, which keeps first executions free of
	// the allocation. Writers hold mu and remove an entry with its record.
	done sync.Map
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

// completed is what Acquire needs of a COMPLETE record.
type completed struct {
	fingerprint string
	resp        *idempotency.Response
	until       instant // the record's ttlUntil
	// The padding makes it 64 bytes, a cache line of its own: at 48 it
	// could share a line with memory written elsewhere, and readers of one
	// key on two cores then ran no faster than on one.
	_ [16]byte
}

// publish makes the COMPLETE record rec of key readable through done.
// Callers hold mu.
func (sh *shard) publish(key string, rec *record) {
	if _, ok := sh.done.Load(key); !ok {
		sh.done.Store(key, &completed{fingerprint: rec.fingerprint, resp: rec.resp, until: rec.ttlUntil})
	}
}

// remove deletes the record rec of key. Callers hold mu.
func (sh *shard) remove(key string, rec *record) {
	delete(sh.records, key)
	if rec.resp != nil {
		sh.done.Delete(key)
	}
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
			sh.remove(key, &rec)
			n++
		} else if at < next {
			next = at
		}
	}
	sh.nextPurge = next
	return n
}
