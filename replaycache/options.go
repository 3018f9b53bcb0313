package replaycache

import "time"

// Option configures a Cache built by New or NewTx.
type Option func(*config)

type config struct {
	maxAge   time.Duration
	maxBytes int64
	clock    func() time.Time
}

func defaultConfig() config {
	return config{
		maxAge:   10 * time.Second,
		maxBytes: 64 << 20,
		clock:    time.Now,
	}
}

// WithMaxAge bounds how long a record stays in the cache, counted from
// when its Acquire was sent to the store, however long the record itself
// still lives. It is the bound on staleness: a record deleted from the
// store by anything but its own expiry (an operator's idemctl delete, a
// flushed database) is still replayed from the cache of every instance
// that held it, for at most d after that instance last asked the store.
// An entry never outlives its record's TTL either way. It panics if d is
// not positive.
//
// Default: 10s.
func WithMaxAge(d time.Duration) Option {
	if d <= 0 {
		panic("replaycache: WithMaxAge needs a positive duration")
	}
	return func(c *config) { c.maxAge = d }
}

// WithMaxBytes bounds the memory the cache's entries hold, in bytes: each
// counts its key and fingerprint, the block holding the response's status
// and headers, the body, and a fixed estimate for its struct, map slot and
// allocation rounding (see EntryOverhead). When an entry would take the
// total over n, the least recently used entries are evicted to make room;
// a response that alone counts for more than n is not cached. It panics if
// n is not positive.
//
// Default: 64 MiB.
func WithMaxBytes(n int64) Option {
	if n <= 0 {
		panic("replaycache: WithMaxBytes needs a positive bound")
	}
	return func(c *config) { c.maxBytes = n }
}

// WithClock sets the clock that ends entries. It exists for tests that
// control time; the clock must not go backwards. It panics if now is nil.
//
// Default: time.Now (its monotonic reading).
func WithClock(now func() time.Time) Option {
	if now == nil {
		panic("replaycache: WithClock needs a clock")
	}
	return func(c *config) { c.clock = now }
}
