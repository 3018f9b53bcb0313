package sqlitestore

import (
	"fmt"
	"time"
)

// Option configures a Store opened by Open.
type Option func(*config)

type config struct {
	table         table
	outbox        table
	busyTimeout   time.Duration
	pollInterval  time.Duration
	purgeInterval time.Duration
	purgeBatch    int
	onPurgeError  func(error)
	clock         func() time.Time
	maxConns      int
	// dsnParams are extra query parameters of the connections' URI (tests
	// simulate a read-only file with them).
	dsnParams string
}

func defaultConfig() config {
	return config{
		table:       mustTable(DefaultTable),
		outbox:      mustTable(DefaultOutboxTable),
		busyTimeout: 5 * time.Second,
		purgeBatch:  1000,
		clock:       time.Now,
		maxConns:    8,
	}
}

func newConfig(opts []Option) config {
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			panic("sqlitestore: nil Option")
		}
		o(&cfg)
	}
	return cfg
}

// WithTable sets the table that holds the records: 1 to 64 ASCII letters,
// digits and underscores, not starting with a digit nor with "sqlite_"
// (SQLite's own). Open creates it when it does not exist, and refuses a
// table of that name with other columns. It panics on any other name.
//
// Default: DefaultTable ("idempotency_records").
func WithTable(name string) Option {
	t := mustTable(name)
	return func(c *config) { c.table = t }
}

// WithOutboxTable sets the outbox table (see package outbox): where
// outbox.Enqueue writes in the Store's transactional routes, and that
// Store.Relay publishes. The name follows WithTable's rules; Open creates
// the table (OutboxSchema) when it does not exist. It panics on any other
// name.
//
// Default: DefaultOutboxTable ("idempotency_outbox").
func WithOutboxTable(name string) Option {
	t := mustTable(name)
	return func(c *config) { c.outbox = t }
}

// WithBusyTimeout sets how long a connection waits for the file's write
// lock when another process (or the application's own writes through
// Store.DB) holds it, before its statement fails with SQLITE_BUSY: SQLite's
// busy_timeout, set on every connection. The Store's own writers wait for
// each other in the Store, not here (see the package documentation). It
// panics when d is negative.
//
// Default: 5s.
func WithBusyTimeout(d time.Duration) Option {
	if d < 0 {
		panic(fmt.Sprintf("sqlitestore: WithBusyTimeout: %v is negative", d))
	}
	return func(c *config) { c.busyTimeout = d }
}

// WithPollInterval says that several processes share the file, and sets
// how often each Watch re-reads its record: a waiter is woken by the
// completes and releases of its own Store at once, and by those of other
// processes within about d. One goroutine per Store polls every watched
// record in one query per interval. With 0, one process owns the file and
// waiters are woken in process only (a complete by another process then
// wakes a waiter only when the holder's lease runs out, when it re-checks
// on its own). It panics when d is negative.
//
// Default: 0 (no polling).
func WithPollInterval(d time.Duration) Option {
	if d < 0 {
		panic(fmt.Sprintf("sqlitestore: WithPollInterval: %v is negative", d))
	}
	return func(c *config) { c.pollInterval = d }
}

// WithPurgeInterval starts a background purge: every d, the Store deletes
// expired records in batches (WithPurgeBatch) until a batch comes back
// short. Close stops it. Expired records are absent whether or not they
// were purged; purging only frees their space. Without it, call
// Store.Purge from a job of your own. It panics when d is not positive.
//
// Default: no background purge.
func WithPurgeInterval(d time.Duration) Option {
	if d <= 0 {
		panic(fmt.Sprintf("sqlitestore: WithPurgeInterval: %v is not positive", d))
	}
	return func(c *config) { c.purgeInterval = d }
}

// WithPurgeBatch sets how many records each transaction of the background
// purge deletes at most (see WithPurgeInterval): a batch holds the file's
// write lock while it runs, so a smaller one makes other writers wait less.
// It panics when n is not positive.
//
// Default: 1000.
func WithPurgeBatch(n int) Option {
	if n <= 0 {
		panic(fmt.Sprintf("sqlitestore: WithPurgeBatch: %d is not positive", n))
	}
	return func(c *config) { c.purgeBatch = n }
}

// WithPurgeErrorHandler sets the function the background purge (see
// WithPurgeInterval) reports its errors to, from its own goroutine; the
// purge tries again at its next interval. It panics when fn is nil.
//
// Default: none; errors are dropped.
func WithPurgeErrorHandler(fn func(error)) Option {
	if fn == nil {
		panic("sqlitestore: WithPurgeErrorHandler: nil handler")
	}
	return func(c *config) { c.onPurgeError = fn }
}

// WithClock sets the clock every lease and TTL is computed from and judged
// against. Every process on a machine reads the same clock, so processes
// sharing a file agree on it; tests set a fake one. It panics when now is
// nil.
//
// Default: time.Now.
func WithClock(now func() time.Time) Option {
	if now == nil {
		panic("sqlitestore: WithClock: nil clock")
	}
	return func(c *config) { c.clock = now }
}

// WithMaxConns bounds the connections the Store opens to the file for
// reads and the application's own statements (the pool of the *sql.DB it
// returns from DB); the Store keeps one more for its own writes and the
// transactional requests' transactions, which take turns on it. Readers
// run in parallel, one per connection; writers take turns whatever the
// bound. It panics when n is not positive.
//
// Default: 8.
func WithMaxConns(n int) Option {
	if n <= 0 {
		panic(fmt.Sprintf("sqlitestore: WithMaxConns: %d is not positive", n))
	}
	return func(c *config) { c.maxConns = n }
}
