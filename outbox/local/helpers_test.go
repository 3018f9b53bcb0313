package local_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency/internal/outboxtest"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/relay"
	"github.com/go-idempotency/idempotency/pgstore"
)

var ctx = context.Background()

// events collects a relay's events.
type events = outboxtest.Events

func newEvents() *events { return outboxtest.NewEvents() }

// noNoise fails t for any event that says the relay marked a message a
// local run had marked, or lost a claim it held.
func noNoise(t testing.TB, e *events) {
	t.Helper()
	for _, k := range []relay.EventKind{relay.EventFenced, relay.EventClaimLost, relay.EventError, relay.EventCanceled} {
		if got := e.Of(k); len(got) != 0 {
			t.Errorf("%d %s events, want none: %+v", len(got), k, got)
		}
	}
}

// start runs a relay on pool through sink until t ends, with a fast
// backoff, and returns its events.
func start(t testing.TB, pool *pgxpool.Pool, sink outbox.Sink, opts ...relay.Option) *events {
	t.Helper()
	return outboxtest.Start(t, func(opts ...relay.Option) *relay.Relay { return relay.New(pool, sink, opts...) }, opts...)
}

// effect writes the local run's effect for e, tagged run, in the run's
// transaction.
func effect(ctx context.Context, e outbox.Envelope, run string) error {
	tx, ok := pgstore.TxFromContext(ctx)
	if !ok {
		return errors.New("no transaction")
	}
	_, err := tx.Exec(ctx, `INSERT INTO effects (message_id, run) VALUES ($1, $2)`, e.ID, run)
	return err
}

// effects returns the runs of each message whose effect committed.
func effects(t testing.TB, db *outboxtest.DB) map[string][]string {
	t.Helper()
	rows, err := db.Pool.Query(ctx, `SELECT message_id, run FROM effects ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	m := map[string][]string{}
	for rows.Next() {
		var id, run string
		if err := rows.Scan(&id, &run); err != nil {
			t.Fatal(err)
		}
		m[id] = append(m[id], run)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return m
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
