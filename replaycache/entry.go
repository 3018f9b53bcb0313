package replaycache

import (
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/wire"
)

// EntryOverhead is what an entry counts for against WithMaxBytes beyond
// the bytes of its strings: its struct, its slot in the map and the
// rounding of its strings to the allocator's size classes. Measured after
// a GC, with 1,000 to 1,000,000 entries, they took 140 to 180 bytes.
const EntryOverhead = 192

// entry is one cached COMPLETE record, the value of an element of the
// cache's LRU list. Its fields do not change once it is in the cache.
type entry struct {
	key         string
	fingerprint string
	// meta holds the response's status, flags and headers in the format
	// of package wire, body a copy of its body: their bytes hold no
	// pointers, and every hit decodes a Response of its own from them.
	meta, body string
	// expires is when the record expires, and until when the entry
	// ends: the earlier of expires and the cache's maximum age, both
	// counted from when the Acquire that filled it was sent.
	expires, until time.Time
	size           int64
}

// newEntry returns the entry for resp, the record at key made with
// fingerprint, expiring at expires and kept until until, or false when
// resp cannot be encoded.
func newEntry(key, fingerprint string, resp *idempotency.Response, expires, until time.Time) (*entry, bool) {
	meta, err := wire.AppendMeta(nil, resp)
	if err != nil {
		return nil, false
	}
	// Key and fingerprint are copied into one string of their own: the
	// caller's may be parts of a larger one the entry must not keep.
	kf := key + fingerprint
	e := &entry{key: kf[:len(key)], fingerprint: kf[len(key):], meta: string(meta), expires: expires, until: until}
	if !resp.BodyOmitted && !resp.HeaderOmitted {
		e.body = string(resp.Body)
	}
	e.size = EntryOverhead + int64(len(e.key)+len(e.fingerprint)+len(e.meta)+len(e.body))
	return e, true
}

// answer is what the entry answers to an Acquire with fingerprint fp at
// now: Completed with a Response decoded for this caller and the time left
// before the record expires, or Mismatch. The entry must not have ended
// at now.
func (e *entry) answer(fp string, now time.Time) (idempotency.Acquisition, error) {
	if fp != e.fingerprint {
		return idempotency.Acquisition{Outcome: idempotency.Mismatch}, nil
	}
	resp, err := wire.Decode(e.meta, e.body)
	if err != nil {
		return idempotency.Acquisition{}, err
	}
	return idempotency.Acquisition{
		Outcome:   idempotency.Completed,
		Response:  resp,
		ExpiresIn: max(e.expires.Sub(now), time.Millisecond),
	}, nil
}
