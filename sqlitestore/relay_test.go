package sqlitestore_test

import (
	"context"
	"testing"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/outbox/relay"
	"github.com/go-idempotency/idempotency/outbox/relay/relaytest"
	"github.com/go-idempotency/idempotency/sqlitestore"
)

// TestRelayConformance runs the relay's conformance suite on SQLite: a
// file of its own for each subtest, relays made by the Store's Relay
// (woken in process by the Store's commits), and the peer relays on
// another Store on the file, as another process would open it (found by
// their poll).
func TestRelayConformance(t *testing.T) {
	relaytest.Run(t, func(t *testing.T) relaytest.Target {
		path := newPath(t)
		s := open(t, path)
		table, err := lifecycle.New(sqlitestore.DefaultOutboxTable, lifecycle.SQLite)
		if err != nil {
			t.Fatal(err)
		}
		return relaytest.Target{
			Engine:   "sqlite",
			NewRelay: s.Relay,
			NewPeerRelay: func(sink outbox.Sink, opts ...relay.Option) *relay.Relay {
				return open(t, path).Relay(sink, opts...)
			},
			Runner: idempotency.NewRunner(s, idempotency.WithTransaction(true)),
			DB:     s.OutboxDB(),
			Table:  table,
			WriteHeaders: func(ctx context.Context, id, headers string) error {
				key, seq, err := outbox.ParseID(id)
				if err != nil {
					return err
				}
				_, err = s.DB().ExecContext(ctx, `UPDATE idempotency_outbox SET headers = ? WHERE storage_key = ? AND seq = ?`, headers, key, seq)
				return err
			},
		}
	})
}
