package pgstore

import (
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency/internal/pgname"
)

// Option configures a Store built by New (and Migrate, which reads only
// WithTable and WithOutboxTable).
type Option func(*config)

type config struct {
	table         table
	outbox        table  // zero until newConfig derives it from the table
	channel       string // "" until newConfig derives it from the table
	listener      *pgx.ConnConfig
	healthCheck   time.Duration
	purgeInterval time.Duration
	purgeBatch    int
	onPurgeError  func(error)
	txOptions     pgx.TxOptions
}

func defaultConfig() config {
	return config{
		table:       mustTable(DefaultTable),
		healthCheck: 5 * time.Second,
		purgeBatch:  1000,
		txOptions:   pgx.TxOptions{IsoLevel: pgx.ReadCommitted},
	}
}

// newConfig applies opts to the defaults and checks what depends on more
// than one option.
func newConfig(opts []Option) config {
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			panic("pgstore: nil Option")
		}
		o(&cfg)
	}
	if cfg.outbox.parts == nil {
		cfg.outbox = mustTable(pgname.Table{Parts: cfg.table.parts}.Sibling(DefaultOutboxTable).String())
	}
	if cfg.channel == "" {
		cfg.channel = strings.Join(cfg.table.parts, ".")
		if len(cfg.channel) > maxIdentifier {
			panic(fmt.Sprintf("pgstore: the notification channel defaults to the table name, and %q is longer than %d bytes: set one with WithChannel", cfg.channel, maxIdentifier))
		}
	}
	return cfg
}

// WithTable sets the table that holds the records: a name, or a schema and
// a name joined by a dot ("billing.idempotency"), each of 1 to 63 ASCII
// letters, digits and underscores, not starting with a digit. The names are
// quoted in every statement, so they are case-sensitive. Create the table
// with Migrate or the SQL of Schema. It panics on any other name.
//
// Default: DefaultTable ("idempotency_records", in the connection's
// search_path).
func WithTable(name string) Option {
	t := mustTable(name)
	return func(c *config) { c.table = t }
}

// WithOutboxTable sets the outbox table that outbox.Enqueue writes the
// messages of this Store's transactions to (see package outbox), and that
// Migrate creates: a name, or a schema and a name joined by a dot, as for
// WithTable. Give the relay (outbox/relay.WithTable) the same name. It
// panics on any other name.
//
// Default: DefaultOutboxTable ("idempotency_outbox"), in the schema of
// the records' table (WithTable).
func WithOutboxTable(name string) Option {
	t := mustTable(name)
	return func(c *config) { c.outbox = t }
}

// WithChannel sets the LISTEN/NOTIFY channel on which complete and release
// announce the records that waiters watch (the payload is the record's
// key). Stores on the same table must use the same channel; stores on other
// tables of the same database had better use other channels, or their
// waiters get each other's notifications (harmless, but wasted). It panics
// when name is empty, longer than 63 bytes or holds a NUL byte.
//
// Default: the table name as given to WithTable ("idempotency_records").
func WithChannel(name string) Option {
	if name == "" || len(name) > maxIdentifier || strings.IndexByte(name, 0) >= 0 {
		panic(fmt.Sprintf("pgstore: WithChannel: %q is not a channel name of 1 to %d bytes", name, maxIdentifier))
	}
	return func(c *config) { c.channel = name }
}

// WithListenerConfig sets how the Store connects the one connection on
// which it LISTENs for waiters (see Store.Watch). Use it when the pool goes
// through a pooler that does not keep LISTEN (PgBouncer in transaction
// mode): the listener then connects to the server directly. The Store
// copies cfg. It panics when cfg is nil.
//
// Default: the pool's connection settings (pool.Config().ConnConfig).
func WithListenerConfig(cfg *pgx.ConnConfig) Option {
	if cfg == nil {
		panic("pgstore: WithListenerConfig: nil config")
	}
	cp := cfg.Copy()
	return func(c *config) { c.listener = cp }
}

// WithListenerHealthCheck sets how the Store notices that its listening
// connection died without a reset (a server that froze, a network that
// dropped it silently): after d without a message it sends a ping, and
// drops the connection when the reply has not come within d more. A dropped
// connection wakes every waiter (each re-checks its record) and is replaced.
// A shorter d notices sooner at the cost of a ping every d on an idle
// connection. It panics when d is not positive.
//
// Default: 5s.
func WithListenerHealthCheck(d time.Duration) Option {
	if d <= 0 {
		panic(fmt.Sprintf("pgstore: WithListenerHealthCheck: %v is not positive", d))
	}
	return func(c *config) { c.healthCheck = d }
}

// WithPurgeInterval starts a background purge: every d, the Store deletes
// expired records in batches (WithPurgeBatch) until a batch comes back
// short. Close stops it. Several instances may purge the same table at
// once: each batch skips the rows another one holds. Expired records are
// absent whether or not they were purged; purging only frees their space.
// Without it, call Store.Purge from a job of your own. It panics when d is
// not positive.
//
// Default: no background purge.
func WithPurgeInterval(d time.Duration) Option {
	if d <= 0 {
		panic(fmt.Sprintf("pgstore: WithPurgeInterval: %v is not positive", d))
	}
	return func(c *config) { c.purgeInterval = d }
}

// WithPurgeBatch sets how many rows each statement of the background purge
// deletes at most (see WithPurgeInterval): one batch is one transaction,
// so a smaller one holds its locks for less time. It panics when n is not
// positive.
//
// Default: 1000.
func WithPurgeBatch(n int) Option {
	if n <= 0 {
		panic(fmt.Sprintf("pgstore: WithPurgeBatch: %d is not positive", n))
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
		panic("pgstore: WithPurgeErrorHandler: nil handler")
	}
	return func(c *config) { c.onPurgeError = fn }
}

// WithTxOptions sets the options of the transactions BeginTx starts for
// routes with idempotency.WithTransaction.
//
// Keep the isolation level at READ COMMITTED unless handlers are short:
// the fence that completes the record updates its row, and at REPEATABLE
// READ or SERIALIZABLE that update fails with a serialization error when
// the row was written after the transaction's first statement: by a steal,
// but also by the heartbeat's extend of a handler that runs longer than a
// third of the lease, or by the watched mark that a duplicate in flight or
// a waiter sets. The middleware
// then rolls back and answers 503 outcome_unknown. Nothing is written
// twice, but the request fails.
//
// Default: pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, whatever the
// server's default_transaction_isolation.
func WithTxOptions(opts pgx.TxOptions) Option {
	return func(c *config) { c.txOptions = opts }
}
