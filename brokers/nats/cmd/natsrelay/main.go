// Command natsrelay publishes the messages of an outbox table (package
// outbox: enqueued by transactional routes and calls on pgstore) to NATS
// JetStream, with each message's ID as its Nats-Msg-Id, until SIGINT or
// SIGTERM. Run as many as you like on one table: they share its messages.
//
//	DATABASE_URL=postgres://app@127.0.0.1/app NATS_URL=nats://127.0.0.1:4222 \
//		natsrelay -stream PAYMENTS -subjects 'payment.>'
//
// With -stream, every publication expects that stream (a subject it does
// not capture is retried, never stored elsewhere), the stream is created
// when it is missing and -subjects is given (with -duplicates as its
// Duplicates window), and natsrelay refuses to start when the stream's
// Duplicates window is shorter than the relay needs: the claim lease plus
// the poll interval, or the backoff cap, whichever is longer (see package
// natsink). Past that window a message the relay publishes again is
// stored twice.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/go-idempotency/idempotency/brokers/nats/natsink"
	"github.com/go-idempotency/idempotency/outbox/relay"
)

// settings are the command's flags.
type settings struct {
	database, nats       string
	stream, subjects     string
	duplicates           time.Duration
	lease, poll, backoff time.Duration
	concurrency, batch   int
	table, name          string
	verbose              bool
}

func main() {
	var s settings
	flag.StringVar(&s.database, "database", os.Getenv("DATABASE_URL"), "PostgreSQL URL of the outbox's database (also $DATABASE_URL)")
	flag.StringVar(&s.nats, "nats", cmp.Or(os.Getenv("NATS_URL"), nats.DefaultURL), "NATS URL (also $NATS_URL)")
	flag.StringVar(&s.stream, "stream", "", "the stream every publication expects; created when missing if -subjects is given")
	flag.StringVar(&s.subjects, "subjects", "", "comma-separated subjects of the stream, when natsrelay creates it")
	flag.DurationVar(&s.duplicates, "duplicates", 2*time.Minute, "the Duplicates window of the stream, when natsrelay creates it")
	flag.DurationVar(&s.lease, "lease", 30*time.Second, "claim lease (relay.WithClaimLease)")
	flag.DurationVar(&s.poll, "poll", 5*time.Second, "poll interval (relay.WithPollInterval)")
	flag.DurationVar(&s.backoff, "backoff-max", time.Minute, "backoff cap, from 1s (relay.WithBackoff)")
	flag.IntVar(&s.concurrency, "concurrency", 4, "messages published at once, each of another ordering key (relay.WithConcurrency)")
	flag.IntVar(&s.batch, "batch", 100, "messages per claim (relay.WithBatchSize)")
	flag.StringVar(&s.table, "table", "", "outbox table (relay.WithTable; default idempotency_outbox)")
	flag.StringVar(&s.name, "name", "", "the relay's name in claimed_by (default host/pid/random)")
	flag.BoolVar(&s.verbose, "v", false, "log every message published")
	flag.Parse()

	level := slog.LevelInfo
	if s.verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, s, logger); err != nil && !errors.Is(err, context.Canceled) {
		logger.Error("natsrelay", "error", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, s settings, logger *slog.Logger) error {
	if s.database == "" {
		return errors.New("no database: set DATABASE_URL or -database")
	}
	if s.backoff < time.Second {
		return errors.New("-backoff-max must be at least 1s")
	}
	pool, err := pgxpool.New(ctx, s.database)
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer pool.Close()

	nc, err := nats.Connect(s.nats, nats.Name("natsrelay"), nats.MaxReconnects(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { logger.Warn("disconnected from NATS", "error", err) }),
		nats.ReconnectHandler(func(nc *nats.Conn) { logger.Info("reconnected to NATS", "url", nc.ConnectedUrlRedacted()) }))
	if err != nil {
		return fmt.Errorf("NATS at %s: %w", s.nats, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}

	var sinkOpts []natsink.Option
	if s.stream != "" {
		if err := ensureStream(ctx, js, s); err != nil {
			return err
		}
		need := natsink.WindowNeeded(s.lease, s.poll, s.backoff)
		if err := natsink.CheckDuplicates(ctx, js, s.stream, need); err != nil {
			return fmt.Errorf("%w (give the stream a longer Duplicates window, or the relay a shorter -lease, -poll or -backoff-max)", err)
		}
		sinkOpts = append(sinkOpts, natsink.WithStream(s.stream))
	}

	opts := []relay.Option{
		relay.WithClaimLease(s.lease),
		relay.WithPollInterval(s.poll),
		relay.WithBackoff(time.Second, s.backoff),
		relay.WithConcurrency(s.concurrency),
		relay.WithBatchSize(s.batch),
		relay.WithObserver(observer(logger)),
	}
	if s.table != "" {
		opts = append(opts, relay.WithTable(s.table))
	}
	if s.name != "" {
		opts = append(opts, relay.WithName(s.name))
	}
	r := relay.New(pool, natsink.New(js, sinkOpts...), opts...)
	logger.Info("natsrelay started", "relay", r.Name(), "nats", nc.ConnectedUrlRedacted(), "stream", s.stream)
	return r.Run(ctx)
}

// ensureStream creates the stream s names when it is missing and
// s.subjects says what it captures.
func ensureStream(ctx context.Context, js jetstream.JetStream, s settings) error {
	_, err := js.Stream(ctx, s.stream)
	switch {
	case err == nil:
		return nil
	case !errors.Is(err, jetstream.ErrStreamNotFound) || s.subjects == "":
		return fmt.Errorf("stream %s: %w", s.stream, err)
	}
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name:       s.stream,
		Subjects:   strings.Split(s.subjects, ","),
		Storage:    jetstream.FileStorage,
		Duplicates: s.duplicates,
	})
	if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return fmt.Errorf("creating stream %s: %w", s.stream, err)
	}
	return nil
}

// observer logs the relay's events: failures at Warn and Error, the
// messages published at Debug.
func observer(logger *slog.Logger) func(context.Context, relay.Event) {
	return func(ctx context.Context, e relay.Event) {
		switch e.Kind {
		case relay.EventPublished:
			logger.DebugContext(ctx, "published", "id", e.ID, "topic", e.Topic, "attempt", e.Attempt, "age", e.Age)
		case relay.EventRetried:
			logger.WarnContext(ctx, "publish failed; retrying", "id", e.ID, "attempt", e.Attempt, "backoff", e.Backoff, "error", e.Err)
		case relay.EventDead:
			logger.ErrorContext(ctx, "message dead", "id", e.ID, "attempt", e.Attempt, "error", e.Err)
		case relay.EventReclaimed, relay.EventFenced:
			logger.WarnContext(ctx, e.Kind.String(), "id", e.ID, "attempt", e.Attempt)
		case relay.EventError:
			logger.ErrorContext(ctx, "relay error", "error", e.Err)
		}
	}
}
