package relay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency/internal/pgname"
	"github.com/go-idempotency/idempotency/pgstore"
)

// Option configures a Relay built by New.
type Option func(*config)

type config struct {
	batch       int
	lease       time.Duration
	backoffMin  time.Duration
	backoffMax  time.Duration
	maxAttempts int
	poll        time.Duration
	retention   time.Duration
	table       pgname.Table
	concurrency int
	name        string
	listener    *pgx.ConnConfig
	observer    func(context.Context, Event)
	logger      *slog.Logger
}

func defaultConfig() config {
	t, _ := pgname.ParseTable(pgstore.DefaultOutboxTable)
	return config{
		batch:       100,
		lease:       30 * time.Second,
		backoffMin:  time.Second,
		backoffMax:  5 * time.Minute,
		maxAttempts: 25,
		poll:        5 * time.Second,
		retention:   7 * 24 * time.Hour,
		table:       t,
		concurrency: 1,
	}
}

// WithBatchSize sets how many messages one claim takes at most. A batch
// holds at most one message of each ordering key (the next one is due once
// the previous is done), and the relay claims again at once after a batch
// that found work. It panics when n is not positive.
//
// Default: 100.
func WithBatchSize(n int) Option {
	if n <= 0 {
		panic(fmt.Sprintf("relay: WithBatchSize: %d is not positive", n))
	}
	return func(c *config) { c.batch = n }
}

// WithClaimLease sets how long a claim holds its messages, on the server's
// clock. A message is presented only while at least half of the lease is
// left (counted on the relay's clock from before the claim was sent), and
// each publish ends by the lease's end; the messages of a batch that come
// too late are handed back unpresented. When a relay dies or stalls, its
// claimed messages are taken back by any relay once the lease has run
// out, each with an attempt counted, and published again: the at-least-
// once case. Keep it well above the sink's slowest confirm times the batch
// size over the concurrency. It panics when d is under a millisecond.
//
// Default: 30s.
func WithClaimLease(d time.Duration) Option {
	if d < time.Millisecond {
		panic(fmt.Sprintf("relay: WithClaimLease: %v is under a millisecond", d))
	}
	return func(c *config) { c.lease = d }
}

// WithBackoff sets the wait before a message whose publish failed is due
// again: min after the first failure, doubling with each failure up to max,
// of which a random part up to half is taken off (so that messages that
// failed together do not come back together). It panics unless
// 0 < min <= max.
//
// Default: 1s and 5m.
func WithBackoff(min, max time.Duration) Option {
	if min <= 0 || max < min {
		panic(fmt.Sprintf("relay: WithBackoff: %v and %v are not 0 < min <= max", min, max))
	}
	return func(c *config) { c.backoffMin, c.backoffMax = min, max }
}

// WithMaxAttempts sets the attempt cap: a message whose n-th attempt fails
// (the sink's error, or a claim that ran out) is dead, with the error
// kept, instead of pending again. An operator requeues it (idemctl outbox
// requeue) once the cause is fixed. It panics when n is not positive.
//
// Default: 25 (with the default backoff, 45 to 85 minutes of retries).
func WithMaxAttempts(n int) Option {
	if n <= 0 {
		panic(fmt.Sprintf("relay: WithMaxAttempts: %d is not positive", n))
	}
	return func(c *config) { c.maxAttempts = n }
}

// WithPollInterval sets how long an idle relay waits at most before it
// looks for due messages again. It is the fallback: a relay is woken by
// the notification of every transaction that commits messages
// (LISTEN/NOTIFY), and by the next retry or claim that runs out, whichever
// is sooner; the poll delivers what a lost notification (a listening
// connection that broke, a pooler that does not pass them) would have
// woken it for. It panics when d is not positive.
//
// Default: 5s.
func WithPollInterval(d time.Duration) Option {
	if d <= 0 {
		panic(fmt.Sprintf("relay: WithPollInterval: %v is not positive", d))
	}
	return func(c *config) { c.poll = d }
}

// WithRetention sets how long done and dead messages are kept before the
// relay purges them (pending and claimed messages never are), checked
// every minute, or every retention when that is shorter. Keep it longer
// than the records' TTL: a key used again after its record expired
// numbers its messages past those still kept, so their IDs stay unique
// for as long as they are kept. It panics when d is not positive.
//
// Default: 168h (7 days).
func WithRetention(d time.Duration) Option {
	if d <= 0 {
		panic(fmt.Sprintf("relay: WithRetention: %v is not positive", d))
	}
	return func(c *config) { c.retention = d }
}

// WithTable sets the outbox table: the name given to
// pgstore.WithOutboxTable, a table or a schema and a table joined by a dot.
// It panics on a name pgstore would refuse.
//
// Default: pgstore.DefaultOutboxTable ("idempotency_outbox", in the
// connection's search_path).
func WithTable(name string) Option {
	t, err := pgname.ParseTable(name)
	if err != nil {
		panic(fmt.Sprintf("relay: WithTable: table name %v", err))
	}
	return func(c *config) { c.table = t }
}

// WithConcurrency sets how many messages of a batch are published at once,
// each of another ordering key (a batch holds one per key). Above 1 the
// sink must be safe for concurrent use. It panics when n is not positive.
//
// Default: 1 (one at a time, in the batch's order).
func WithConcurrency(n int) Option {
	if n <= 0 {
		panic(fmt.Sprintf("relay: WithConcurrency: %d is not positive", n))
	}
	return func(c *config) { c.concurrency = n }
}

// WithName names the relay in the claimed_by column of the messages it
// claims (idemctl outbox shows it) and in its events. It panics when name
// is empty.
//
// Default: "<hostname>/<pid>/<4 random bytes in hex>".
func WithName(name string) Option {
	if name == "" {
		panic("relay: WithName: empty name")
	}
	return func(c *config) { c.name = name }
}

// WithListenerConfig sets how the relay connects the one connection on
// which it LISTENs for the notifications of committed messages. Use it
// when the pool goes through a pooler that does not keep LISTEN (PgBouncer
// in transaction mode): the listener then connects to the server
// directly. The relay copies cfg. It panics when cfg is nil.
//
// Default: the pool's connection settings (pool.Config().ConnConfig).
func WithListenerConfig(cfg *pgx.ConnConfig) Option {
	if cfg == nil {
		panic("relay: WithListenerConfig: nil config")
	}
	cp := cfg.Copy()
	return func(c *config) { c.listener = cp }
}

// WithObserver sets a function that the relay reports its events to (see
// Event), from its own goroutines: adapters/prometheus's RelayObserver and
// adapters/otel's RelayObserver turn them into metrics. It panics when fn
// is nil.
//
// Default: none.
func WithObserver(fn func(ctx context.Context, e Event)) Option {
	if fn == nil {
		panic("relay: WithObserver: nil function")
	}
	return func(c *config) { c.observer = fn }
}

// WithLogger logs what goes wrong: a failed publish (Warn, with the
// message's ID, topic, attempt and the sink's error, and the backoff
// before the next attempt), a message gone dead (Error), a claim taken
// back from a relay that died or stalled (Warn), a mark refused because
// the claim had been taken back (Warn), and a statement that failed
// (Error); the messages published and the purges at Debug. Each record
// carries the relay's name. Log records carry message IDs (storage keys,
// which are hashes) and errors, never payloads or headers. The observer
// (WithObserver) gets the same events, and more.
//
// Default: none (nothing is logged).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.logger = l }
}

// defaultName returns "<hostname>/<pid>/<random hex>".
func defaultName() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "relay"
	}
	var b [4]byte
	rand.Read(b[:])
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}
