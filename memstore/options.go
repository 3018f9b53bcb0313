package memstore

import "time"

// Option configures a Store built by New.
type Option func(*config)

type config struct {
	maxEntries    int
	maxBytes      int64
	sweepInterval time.Duration
	clock         func() time.Time // nil: time.Now, read through time.Since
}

func defaultConfig() config {
	return config{
		maxEntries:    1_000_000,
		maxBytes:      256 << 20,
		sweepInterval: time.Minute,
	}
}

// WithMaxEntries bounds the number of records the store holds. When it is
// full, Acquire of a new key first purges expired records and, if that frees
// no room, returns idempotency.ErrStoreFull. Live records are never evicted:
// not IN_PROGRESS ones, whose handler is still running, and not unexpired
// COMPLETE ones, whose loss would let a duplicate run the handler again.
// The bound is global: one client (one principal) can fill it for every
// other. It panics if n is not positive.
//
// Default: 1_000_000.
func WithMaxEntries(n int) Option {
	if n <= 0 {
		panic("memstore: WithMaxEntries needs a positive bound")
	}
	return func(c *config) { c.maxEntries = n }
}

// WithMaxBytes bounds the memory the store's records hold, in bytes: their
// keys, fingerprints and lease tokens, the blocks that hold their status
// and headers, their bodies (which the store copies), and a fixed 160
// bytes per record for its struct and map slot. Not counted: the
// registrations of waiters (Watch), which last only while their requests
// wait, and the Responses that replays decode, which belong to the caller.
//
// Acquire of a new key whose record would take the total over n first
// purges expired records and, if that frees too little, returns an error
// wrapping idempotency.ErrStoreFull; as with WithMaxEntries, no live record
// is ever evicted. Complete never fails for lack of room, since a record
// left IN_PROGRESS would let a duplicate run the handler again, and never
// takes the total over n: when the body would, the record is stored with
// its body omitted (idempotency.Response.BodyOmitted), and duplicates get
// the status and headers with an empty body; when the headers would too,
// the record keeps the status alone (HeaderOmitted), in a few bytes every
// IN_PROGRESS record holds for that from Acquire on. Only a steal by a
// longer lease token can take the total over n, by the difference.
//
// The bound is global: one client (one principal) can fill it for every
// other, with few records if their bodies are large. Size it for the
// traffic, scope keys to the principal, and rate-limit clients upstream.
// It panics if n is not positive.
//
// Default: 256 MiB. About 750,000 records with two short headers and no
// body fit, or 190,000 with 1 KiB bodies, so with small records this
// bound, not WithMaxEntries, is the one reached first.
func WithMaxBytes(n int64) Option {
	if n <= 0 {
		panic("memstore: WithMaxBytes needs a positive bound")
	}
	return func(c *config) { c.maxBytes = n }
}

// WithSweepInterval sets how often a background goroutine purges expired
// records, one shard at a time. Expired records are treated as absent
// whether or not the sweep has run; the sweep only frees their memory.
// It panics if d is not positive.
//
// Default: 1 minute.
func WithSweepInterval(d time.Duration) Option {
	if d <= 0 {
		panic("memstore: WithSweepInterval needs a positive interval")
	}
	return func(c *config) { c.sweepInterval = d }
}

// WithClock sets the clock that decides lease and TTL expiry. It exists for
// tests that control time; the clock must not go backwards. It panics if
// now is nil.
//
// Default: time.Now.
func WithClock(now func() time.Time) Option {
	if now == nil {
		panic("memstore: WithClock needs a clock")
	}
	return func(c *config) { c.clock = now }
}
