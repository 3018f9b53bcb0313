package relay_test

import (
	"context"
	"testing"

	"github.com/go-idempotency/idempotency/internal/outboxtest"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/outbox/relay"
	"github.com/go-idempotency/idempotency/outbox/relay/relaytest"
)

// TestRelayConformance runs the relay's conformance suite on PostgreSQL:
// a database of its own for each subtest (pgstore's tables), relays made
// by New on its pool (woken by LISTEN/NOTIFY), and the peer relays on a
// pool of their own.
func TestRelayConformance(t *testing.T) {
	relaytest.Run(t, func(t *testing.T) relaytest.Target {
		db := outboxtest.NewDB(t)
		return relaytest.Target{
			Engine: "postgres",
			NewRelay: func(sink outbox.Sink, opts ...relay.Option) *relay.Relay {
				return relay.New(db.Pool, sink, opts...)
			},
			NewPeerRelay: func(sink outbox.Sink, opts ...relay.Option) *relay.Relay {
				return relay.New(newPool(t, db.URL), sink, opts...)
			},
			Runner: db.Runner,
			DB:     lifecycle.Pgx(db.Pool),
			Table:  table(t),
			WriteHeaders: func(ctx context.Context, id, headers string) error {
				key, seq, err := outbox.ParseID(id)
				if err != nil {
					return err
				}
				_, err = db.Pool.Exec(ctx, `UPDATE idempotency_outbox SET headers = $3::jsonb WHERE storage_key = $1 AND seq = $2`, key, seq, headers)
				return err
			},
		}
	})
}
