package memstore

import (
	"math"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/wire"
)

// instant is a point on the store's clock: the time since the store was
// created. Using an offset keeps records small and, with time.Since,
// follows the monotonic clock.
type instant int64

// after returns i+d, saturating instead of overflowing.
func (i instant) after(d time.Duration) instant {
	if d > 0 && int64(i) > math.MaxInt64-int64(d) {
		return math.MaxInt64
	}
	return i + instant(d)
}

// record is one idempotency record. It is COMPLETE when done.meta is set
// and IN_PROGRESS otherwise; an absent record has no entry. Records are
// changed in place under their shard's lock.
type record struct {
	fingerprint string
	token       string
	done        payload // a COMPLETE record's response
	epoch       uint64
	leaseUntil  instant
	// ttlUntil is when a COMPLETE record expires, and when an IN_PROGRESS
	// record's TTL ends (it is purged only once its lease has ended too).
	ttlUntil instant
	// held is what the record counts for in the store's byte total (see
	// WithMaxBytes). Whatever takes the record out of its map takes held
	// off the total.
	held int64
}

// payload is a stored response: meta holds its status, flags and headers
// in the format of package wire, body a copy of its body. Their bytes hold
// no pointers, so the garbage collector does not scan them.
type payload struct{ meta, body string }

// size is what p counts for in the store's byte total.
func (p payload) size() int64 { return int64(len(p.meta) + len(p.body)) }

// omitBody returns the meta block of resp marked BodyOmitted, for a
// record whose body the store has no room for.
func omitBody(resp *idempotency.Response) string {
	r := *resp
	r.Body, r.BodyOmitted = nil, true
	// resp's own block was encoded without error, and r differs from it in
	// its body only, which the block does not hold.
	block, _ := wire.AppendMeta(nil, &r)
	return string(block)
}

// omitAll returns the meta block of a response with status alone, marked
// HeaderOmitted (and BodyOmitted), for a record whose headers the store has
// no room for either. Its size is completionReserve.
func omitAll(status int) string {
	block, _ := wire.AppendMeta(nil, &idempotency.Response{Status: status, BodyOmitted: true, HeaderOmitted: true})
	return string(block)
}

// completionReserve is the room every IN_PROGRESS record holds for its
// completion: the meta block of omitAll (a status of 200..599 is two bytes
// long as a uvarint), so that a record can always complete within the
// store's byte bound.
var completionReserve = int64(len(omitAll(599)))

// recordOverhead is the memory a record holds beyond the bytes of its
// strings, as WithMaxBytes counts it: the record, its slot in the shard's
// map, and the rounding of its strings to the allocator's size classes.
// Measured after a GC, with 1,000 to 1,000,000 records, the record and its
// slot took 130 to 155 bytes.
const recordOverhead = 160

// inProgressSize is what a new IN_PROGRESS record of key counts for,
// completionReserve included.
func inProgressSize(key, fingerprint, token string) int64 {
	return recordOverhead + completionReserve + int64(len(key)+len(fingerprint)+len(token))
}

// complete reports whether the record is COMPLETE.
func (r *record) complete() bool { return r.done.meta != "" }

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
