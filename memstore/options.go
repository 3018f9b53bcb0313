package memstore

import "time"

// Option configures a Store built by New.
type Option func(*config)

type config struct {
	maxEntries    int
	sweepInterval time.Duration
	clock         func() time.Time // nil: time.Now, read through time.Since
}

func defaultConfig() config {
	return config{
		maxEntries:    1_000_000,
		sweepInterval: time.Minute,
	}
}

// WithMaxEntries bounds the number of records the store holds. When it is
// full, Acquire of a new key first purges expired records and, if that frees
// no room, returns idempotency.ErrStoreFull. Live records are never evicted:
// not IN_PROGRESS ones, whose handler is still running, and not unexpired
// COMPLETE ones, whose loss would let a duplicate run the handler again.
// It panics if n is not positive.
//
// Default: 1_000_000.
func WithMaxEntries(n int) Option {
	if n <= 0 {
		panic("memstore: WithMaxEntries needs a positive bound")
	}
	return func(c *config) { c.maxEntries = n }
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
