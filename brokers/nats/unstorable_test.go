package idemnats_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/go-idempotency/idempotency"
	idemnats "github.com/go-idempotency/idempotency/brokers/nats"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/pgstore"
)

// TestUnstorableResult: a handler whose result the Runner's codec cannot
// encode ran once, and its record is stored marked omitted: the message
// is acked, and a duplicate is acked as a replay without running the
// handler again, on memstore, Redis and PostgreSQL (there on a
// transactional Runner, whose writes commit with the omitted record
// rather than roll back and run again on every redelivery).
func TestUnstorableResult(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"memstore", "redis", "postgres"} {
		t.Run(store, func(t *testing.T) {
			var r *idempotency.Runner
			rows := func() int { return 0 }
			switch store {
			case "memstore":
				r = idempotency.NewRunner(newMemStore(t))
			case "redis":
				r = idempotency.NewRunner(newRedisStore(t, redisAddr(t), redistest.Prefix()))
			case "postgres":
				s, pool := newPGStore(t, pgDatabase(t))
				r = idempotency.NewRunner(s, idempotency.WithTransaction(true))
				rows = func() int {
					var n int
					if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM effects").Scan(&n); err != nil {
						t.Fatal(err)
					}
					return n
				}
			}
			f := newFixture(t)
			var runs atomic.Int64
			p := idemnats.NewProcessor(r, "orders.charge", func(ctx context.Context, msg jetstream.Msg) (chan int, error) {
				runs.Add(1)
				if tx, ok := pgstore.TxFromContext(ctx); ok {
					if _, err := tx.Exec(ctx, "INSERT INTO effects VALUES ('o-1', 1, 0)"); err != nil {
						return nil, err
					}
				}
				return make(chan int), nil // encoding/json cannot encode a channel
			}, f.options()...)
			f.st.publish(t, "charge", "Order-Id", "o-1")
			f.st.publish(t, "charge", "Order-Id", "o-1")

			out, err := p.Process(context.Background(), f.next(t))
			if out.Action != idemnats.Ack || out.Reason != idempotency.OutcomeOmitted || !errors.Is(err, idempotency.ErrResultOmitted) {
				t.Fatalf("first: %+v %v, want an ack of a record stored omitted", out, err)
			}
			out, err = p.Process(context.Background(), f.next(t))
			if err != nil || out.Action != idemnats.Ack || out.Reason != idempotency.OutcomeReplayedOmitted || out.Ran {
				t.Fatalf("duplicate: %+v %v, want an ack as a replay", out, err)
			}
			if n := runs.Load(); n != 1 {
				t.Fatalf("the handler ran %d times, want once", n)
			}
			if store == "postgres" && rows() != 1 {
				t.Fatalf("%d effect rows, want 1", rows())
			}
			f.none(t, quiet)
		})
	}
}
