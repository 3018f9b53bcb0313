// Command payments-consumer applies the payment.created messages that
// examples/chi-server enqueues (in PostgreSQL mode, with NATS_URL set) and
// natsrelay publishes to JetStream: each message adds one row to the
// ledger table, written in the transaction that completes the message's
// idempotency record (an idemnats.Processor on a transactional Runner over
// pgstore). A message delivered twice (redelivered after a crash, or
// published twice by the relay) adds one row.
//
//	DATABASE_URL=postgres://app@127.0.0.1/app NATS_URL=nats://127.0.0.1:4222 go run .
//
// It consumes the stream PAYMENTS (-stream), which natsrelay creates
// (start it first), with the durable consumer "ledger" (-durable); several
// instances share the consumer. The ledger table is in the database at
// DATABASE_URL, with the consumer's idempotency records. GET /ledger on
// -addr (default 127.0.0.1:8081) counts its rows.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/go-idempotency/idempotency"
	idemnats "github.com/go-idempotency/idempotency/brokers/nats"
	"github.com/go-idempotency/idempotency/pgstore"
)

// settings are the command's flags.
type settings struct {
	database, nats  string
	stream, durable string
	addr            string
	ackWait, lease  time.Duration
	workers         int
}

func main() {
	var s settings
	flag.StringVar(&s.database, "database", os.Getenv("DATABASE_URL"), "PostgreSQL URL of the ledger and the consumer's records (also $DATABASE_URL)")
	flag.StringVar(&s.nats, "nats", cmp.Or(os.Getenv("NATS_URL"), nats.DefaultURL), "NATS URL (also $NATS_URL)")
	flag.StringVar(&s.stream, "stream", "PAYMENTS", "the stream natsrelay publishes to")
	flag.StringVar(&s.durable, "durable", "ledger", "the durable consumer's name")
	flag.StringVar(&s.addr, "addr", "127.0.0.1:8081", "listen address of GET /ledger")
	flag.DurationVar(&s.ackWait, "ack-wait", 30*time.Second, "the consumer's AckWait")
	flag.DurationVar(&s.lease, "lease", 30*time.Second, "the lease of each message's record")
	flag.IntVar(&s.workers, "workers", 2, "messages handled at once")
	flag.Parse()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, s, logger); err != nil {
		logger.Error("payments-consumer", "error", err)
		os.Exit(1)
	}
}

// ledgerSchema is the consumer's own table: one row per payment.created
// applied. It has no unique constraint, so that a message applied twice
// would show as a second row.
const ledgerSchema = `
CREATE TABLE IF NOT EXISTS ledger (
	id         bigserial   PRIMARY KEY,
	payment_id text        NOT NULL,
	user_name  text        NOT NULL,
	amount     bigint      NOT NULL,
	currency   text        NOT NULL,
	message_id text        NOT NULL,
	applied    timestamptz NOT NULL DEFAULT now()
)`

// payment is the payload of payment.created.
type payment struct {
	ID       string `json:"id"`
	User     string `json:"user"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// entry is the result stored with each message's record.
type entry struct {
	Ledger  int64  `json:"ledger"`
	Payment string `json:"payment"`
}

func run(ctx context.Context, s settings, logger *slog.Logger) error {
	if s.database == "" {
		return errors.New("no database: set DATABASE_URL or -database")
	}
	pool, err := pgxpool.New(ctx, s.database)
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer pool.Close()
	if err := pgstore.Migrate(ctx, pool); err != nil {
		return fmt.Errorf("database: %w", err)
	}
	if _, err := pool.Exec(ctx, ledgerSchema); err != nil {
		return fmt.Errorf("database: ledger table: %w", err)
	}

	nc, err := nats.Connect(s.nats, nats.Name("payments-consumer"), nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("NATS at %s: %w", s.nats, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, s.stream, jetstream.ConsumerConfig{
		Durable:       s.durable,
		FilterSubject: "payment.created",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       s.ackWait,
	})
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("no stream %s: start natsrelay -stream %s -subjects 'payment.>' first", s.stream, s.stream)
	}
	if err != nil {
		return fmt.Errorf("consumer %s: %w", s.durable, err)
	}

	store := pgstore.New(pool)
	defer store.Close()
	runner := idempotency.NewRunner(store, idempotency.WithTransaction(true), idempotency.WithLease(s.lease))
	p := idemnats.NewProcessor(runner, "ledger.payment-created", func(ctx context.Context, msg jetstream.Msg) (entry, error) {
		return apply(ctx, msg, logger)
	})

	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: ledgerCount(pool), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	logger.Info("payments-consumer started", "stream", s.stream, "consumer", s.durable, "ledger", "http://"+ln.Addr().String()+"/ledger")

	// The first worker to fail stops the others; run returns once all
	// have, before its deferred closes of the store and the pool.
	wctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	var wg sync.WaitGroup
	for range s.workers {
		wg.Go(func() {
			if err := p.Consume(wctx, cons, jetstream.PullMaxMessages(8)); err != nil {
				stop(err)
			}
		})
	}
	wg.Wait()
	if err := context.Cause(wctx); ctx.Err() == nil && err != nil {
		return err
	}
	return nil
}

// apply adds the ledger row of msg's payment in the transaction that
// completes msg's record: the row and the record commit together, once per
// Nats-Msg-Id.
func apply(ctx context.Context, msg jetstream.Msg, logger *slog.Logger) (entry, error) {
	var p payment
	if err := json.Unmarshal(msg.Data(), &p); err != nil {
		return entry{}, fmt.Errorf("payment.created: %w", err)
	}
	info, _ := idempotency.FromContext(ctx)
	tx, ok := pgstore.TxFromContext(ctx)
	if !ok {
		return entry{}, errors.New("no transaction")
	}
	var id int64
	err := tx.QueryRow(ctx,
		`INSERT INTO ledger (payment_id, user_name, amount, currency, message_id) VALUES ($1, $2, $3, $4, $5) RETURNING id`,
		p.ID, p.User, p.Amount, p.Currency, info.Key).Scan(&id)
	if err != nil {
		return entry{}, err
	}
	logger.InfoContext(ctx, "applied", "payment", p.ID, "amount", p.Amount, "currency", p.Currency, "message", info.Key, "ledger", id)
	return entry{Ledger: id, Payment: p.ID}, nil
}

// ledgerCount answers GET /ledger with the number of ledger rows.
func ledgerCount(pool *pgxpool.Pool) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ledger", func(w http.ResponseWriter, r *http.Request) {
		var n int64
		if err := pool.QueryRow(r.Context(), `SELECT count(*) FROM ledger`).Scan(&n); err != nil {
			http.Error(w, "ledger not countable", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]int64{"ledger_rows": n})
	})
	return mux
}
