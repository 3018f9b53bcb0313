package state

import (
	"context"
	"fmt"
	"strings"

	"github.com/go-idempotency/idempotency/internal/pgname"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/pgstore"
)

// Option configures a Store built by New.
type Option func(*config)

type config struct {
	table   pgname.Table
	outbox  string // "" until newConfig derives it from the table
	maxData int
	topic   string
	trace   func(context.Context) map[string]string
	dialect Dialect
}

func newConfig(opts []Option) config {
	cfg := config{
		table:   mustTable(pgstore.DefaultStateTable),
		maxData: DefaultMaxDataBytes,
		topic:   DefaultTopicPrefix,
		dialect: PostgreSQL,
	}
	for _, o := range opts {
		if o == nil {
			panic("state: nil Option")
		}
		o(&cfg)
	}
	if cfg.outbox == "" {
		cfg.outbox = cfg.table.Sibling(pgstore.DefaultOutboxTable).String()
	}
	return cfg
}

// mustTable parses name as pgstore does a table's name, and panics on a
// name it would refuse, or whose history's name would be too long.
func mustTable(name string) pgname.Table {
	t, err := pgname.ParseTable(name)
	if err == nil {
		_, err = pgname.ParseTable(pgstore.StateHistoryTable(name))
	}
	if err != nil {
		panic(fmt.Sprintf("state: table name %v", err))
	}
	return t
}

// WithTable sets the table of the records: a name, or a schema and a name
// joined by a dot ("billing.idempotency_state"), each of 1 to 63 ASCII
// letters, digits and underscores, not starting with a digit, as
// pgstore.WithTable takes them; their history is the table named
// pgstore.StateHistoryTable(name). Create both with pgstore.Migrate (the
// default name, in the schema of pgstore's table) or the SQL of
// pgstore.StateSchema(name). It panics on any other name, and on a name
// whose history's name is longer than 63 bytes.
// Default: pgstore.DefaultStateTable ("idempotency_state", in the
// connection's search_path).
func WithTable(name string) Option {
	t := mustTable(name)
	return func(c *config) { c.table = t }
}

// WithOutboxTable sets the outbox table that the transitions made outside
// a transactional route or call write their events to, as
// pgstore.WithOutboxTable takes it: give both the same name. Inside one,
// the event goes to the outbox of the pgstore.Store that began the
// transaction, as outbox.Enqueue's messages do. It panics on a name
// pgstore would refuse.
// Default: pgstore.DefaultOutboxTable ("idempotency_outbox"), in the
// schema of the records' table (WithTable).
func WithOutboxTable(name string) Option {
	if _, err := pgname.ParseTable(name); err != nil {
		panic(fmt.Sprintf("state: outbox table name %v", err))
	}
	return func(c *config) { c.outbox = name }
}

// WithMaxDataBytes caps a record's data, in bytes: Create and Transition
// refuse larger data with an InvalidArgumentError before any statement
// runs. 0 takes away the cap (the events never carry the data, so only
// the table pays for it). It panics when n is negative.
// Default: DefaultMaxDataBytes (64 KiB).
func WithMaxDataBytes(n int) Option {
	if n < 0 {
		panic("state: WithMaxDataBytes: negative cap")
	}
	return func(c *config) { c.maxData = n }
}

// DefaultTopicPrefix is the topic prefix of the events unless
// WithTopicPrefix sets another.
const DefaultTopicPrefix = "state"

// WithTopicPrefix sets the prefix of the events' topic: a transition of a
// record of machine m is published to "<prefix>.<m>" ("state.payments.payment"),
// the subject (NATS) or routing key (RabbitMQ) its consumers bind. It
// panics when the topics would break the outbox's grammar
// (outbox.Message): prefix must be visible ASCII without '*', '>' or an
// empty dot-separated part.
// Default: DefaultTopicPrefix ("state").
func WithTopicPrefix(prefix string) Option {
	// The longest machine name makes the longest topic.
	longest := prefix + "." + strings.Repeat("m", MaxMachineBytes)
	if err := (outbox.Message{Topic: longest}).Validate(); err != nil {
		panic(fmt.Sprintf("state: WithTopicPrefix(%q): %v", prefix, err))
	}
	return func(c *config) { c.topic = prefix }
}

// WithTraceContext sets where the trace context of a transition comes
// from: f returns the context's propagation headers, of which the W3C
// traceparent and tracestate are kept (other keys are dropped, and so are
// values that are not printable ASCII of at most 512 bytes). They go into
// the event's Cause and into its outbox message's headers, so that the
// publish and its consumers join the request's trace (adapters/otel's
// TraceHeaders is such a function, and its Sink reads the headers).
// Default: none; events carry no trace context.
func WithTraceContext(f func(ctx context.Context) map[string]string) Option {
	if f == nil {
		panic("state: WithTraceContext needs a function")
	}
	return func(c *config) { c.trace = f }
}
