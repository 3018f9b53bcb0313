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
		batch:       500,
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
// that found work, while the sink presents the batch before (see Run).
// Larger batches cost the database fewer statements and commits per
// message; smaller ones hold less: a relay holds three batches at most,
// their payloads in memory, and a relay that dies has the messages of
// those it claimed published again once their claim runs out (at least
// once). It panics when n is not positive.
//
// Default: 500.
func WithBatchSize(n int) Option {
	if n <= 0 {
		panic(fmt.Sprintf("relay: WithBatchSize: %d is not positive", n))
	}
	return func(c *config) { c.batch = n }
}

// WithClaimLease sets how long a claim holds its messages, on the server's
// clock. While the sink works on a message, or messages of the batch wait
// for their turn or their done mark, the relay extends the claim every
// third of the lease; it counts the claim conservatively (from before the
// statement that took or extended it was sent, a tenth early) and cancels
// the sink's context, with a cause wrapping outbox.ErrClaimLost, before
// the claim could be taken back (its database unreachable for most of a
// lease), or as soon as an extend finds the message no longer claimed (an
// operator canceled or suspended it). A message is presented only while at
// least half of the lease is left; the messages of a batch that come too
// late are handed back unpresented. When a relay dies or stalls, its
// claimed messages are taken back by any relay once the lease has run
// out, each with an attempt counted, and published again: the
// at-least-once case. A short lease costs extends; a long one delays the
// takeover of a dead relay's messages. It panics when d is under a
// millisecond.
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
// kept, instead of waiting for a retry. A sink's permanent refusal
// (outbox.Permanent) and a row the relay cannot read are dead at once,
// whatever the cap; a sink's suspension (outbox.Suspend) counts no
// attempt. An operator requeues a dead message (idemctl outbox requeue)
// once the cause is fixed. It panics when n is not positive.
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

// WithRetention sets how long finished messages (done, dead, canceled) are
// kept before the relay purges them (others never are), checked
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

// WithConcurrency sets how many messages of a batch are published at once
// through a sink that publishes one message per call, each of another
// ordering key (a batch holds one per key). Above 1 the sink must be safe
// for concurrent use. A sink that is an outbox.BatchSink is given each
// batch in one call instead, and keeps its own window of publications
// waiting for their confirms: the concurrency does not apply. It panics
// when n is not positive.
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
// before the next attempt), a message gone dead, refused by its sink or
// unreadable (Error, with the error), a message its sink suspended (Warn,
// with the reason), a claim taken back from a relay that died or stalled
// (Warn), a claim found lost while the relay held it and a mark refused
// because of it (Warn, with the state the message was found in), a
// message canceled while presented (Info), and a statement that failed
// (Error); the messages published, the extends, the messages handed back
// and the purges at Debug. Each record carries the relay's name. Log
// records carry message IDs (storage keys, which are hashes), errors and
// a sink's reasons, never payloads or headers. The observer (WithObserver)
// gets the same events, and more.
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
