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

// Memory of an entry of the index of published records, as WithMaxBytes
// counts it. publishedOverhead covers the entry, its decoded Response and
// its share of the index's slots; the Response's header map adds
// mapOverhead and its slots, each a name and a slice of values with a
// control byte, which come in one group of 8 up to 8 headers and otherwise
// in a power of two above 8/7 of them; each value adds its string header.
// Measured after a GC, an entry held about 110 bytes without headers, 545
// with two, 640 with eight and 1,860 with sixteen; publishedSize gives 128,
// 560, 656 and 1,840.
const (
	publishedOverhead = 128
	mapOverhead       = 48
	mapSlot           = 44
	valueSize         = 16
)

// publishedSize is what the entry of resp counts for.
func publishedSize(resp *idempotency.Response) int64 {
	n := len(resp.Header)
	if n == 0 {
		return publishedOverhead
	}
	slots := 8
	for n > 8 && slots*7 < n*8 {
		slots *= 2
	}
	size := publishedOverhead + mapOverhead + mapSlot*slots
	for _, values := range resp.Header {
		size += valueSize * len(values)
	}
	return int64(size)
}

// publish makes the COMPLETE record rec of key, whose hash is h, readable
// through sh.done, with its response decoded once for every later
// duplicate, and returns that response. When the entry would take the
// store over its byte bound, it returns the response unpublished, and a
// later duplicate tries again. It writes rec back to the map with the
// entry's bytes. Callers hold sh.mu.
func (s *Store) publish(sh *shard, key string, h uint64, rec *record) (*idempotency.Response, error) {
	if c := sh.done.get(key, h); c != nil {
		return c.resp, nil
	}
	resp, err := payload{rec.meta, rec.body}.response()
	if err != nil {
		return nil, err
	}
	if size := publishedSize(resp); s.take(size) {
		sh.done.put(&completed{key: key, hash: h, fingerprint: rec.fingerprint, resp: resp, until: rec.ttlUntil})
		rec.held += size
		sh.records[key] = *rec
	}
	return resp, nil
}

// noteDeadline keeps nextPurge no later than at. Callers hold mu.
func (sh *shard) noteDeadline(at instant) {
	if at < sh.nextPurge {
		sh.nextPurge = at
	}
}

// purge deletes the records that are absent at now and returns how many it
// deleted and the bytes they held; hash is Store.hash. Callers hold mu.
func (sh *shard) purge(now instant, hash func(string) uint64) (n int, held int64) {
	if now < sh.nextPurge {
		return 0, 0
	}
	next := instant(math.MaxInt64)
	for key, rec := range sh.records {
		at := rec.purgeAt()
		if now >= at {
			delete(sh.records, key)
			if rec.complete() && sh.done.live > 0 {
				sh.done.remove(key, hash(key))
			}
			n++
			held += rec.held
		} else if at < next {
			next = at
		}
	}
	sh.nextPurge = next
	if n > 0 {
		sh.done.shrink()
	}
	return n, held
}
