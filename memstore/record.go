package memstore

import (
	"math"
	"time"
)

// instant is a point on the store's clock: the time since the store was
// created. Using an offset keeps records small and, with time.Now, follows
// the monotonic clock.
type instant int64

// after returns i+d, saturating instead of overflowing.
func (i instant) after(d time.Duration) instant {
	if d > 0 && int64(i) > math.MaxInt64-int64(d) {
		return math.MaxInt64
	}
	return i + instant(d)
}

// record is one idempotency record. It is COMPLETE when meta is set and
// IN_PROGRESS otherwise; an absent record has no entry.
type record struct {
	fingerprint string
	token       string
	// meta and body are a COMPLETE record's response in the wire format:
	// meta holds its status, flags and headers, body its body. Neither
	// holds a pointer, so the collector does not scan them however long
	// the record is kept, as it would scan a header map.
	meta  string
	body  string
	epoch uint32 // steals of one record within its TTL never come near 2³²
	// dups counts the duplicates a COMPLETE record has answered under the
	// lock, up to the one that publishes it (see shard.done).
	dups       uint32
	leaseUntil instant
	// ttlUntil is when a COMPLETE record expires, and when an IN_PROGRESS
	// record's TTL ends (it is purged only once its lease has ended too).
	ttlUntil instant
	// held is what the record counts for in the store's byte total (see
	// WithMaxBytes): recordOverhead, its key, fingerprint and token, once
	// COMPLETE its status and headers block and its body, and once
	// published (see shard.done) its entry there. Whatever takes the
	// record out of the map takes held off the total.
	held int64
}

// recordOverhead is the memory a record holds beyond the bytes of its
// strings, as WithMaxBytes counts it: its slot in the shard's map (the
// key's string header and the record, 112 bytes, in a table that the map
// keeps between 7/16 and 7/8 full) and the rounding of its strings up to
// the allocator's size classes. Measured after a GC, with 1,000 to 160,000
// records, it was 180 to 215 bytes (BenchmarkRecordMemory: about 180 with
// 20,000).
const recordOverhead = 192

// inProgressSize is what a new IN_PROGRESS record of key counts for.
func inProgressSize(key, fingerprint, token string) int64 {
	return recordOverhead + int64(len(key)+len(fingerprint)+len(token))
}

// complete reports whether the record is COMPLETE.
func (r *record) complete() bool { return r.meta != "" }

// purgeAt is when the record becomes absent.
func (r *record) purgeAt() instant {
	if !r.complete() && r.leaseUntil > r.ttlUntil {
		return r.leaseUntil
	}
	return r.ttlUntil
}

// live reports whether the record still exists at now.
func (r *record) live(now instant) bool { return now < r.purgeAt() }

// heldBy reports whether the record is IN_PROGRESS under token.
func (r *record) heldBy(token string) bool { return !r.complete() && r.token == token }
