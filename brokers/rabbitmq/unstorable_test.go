package idemrabbit_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	idemrabbit "github.com/go-idempotency/idempotency/brokers/rabbitmq"
	"github.com/go-idempotency/idempotency/brokers/rabbitmq/rabbittest"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/pgstore"
	"github.com/go-idempotency/idempotency/redisstore"
)

// TestUnstorableResult: a handler whose result the Runner's codec cannot
// encode ran once, and its record is stored marked omitted: the delivery
// is acked, and a duplicate is acked as a replay without running the
// handler again, on memstore, Redis and PostgreSQL (there on a
// transactional Runner, whose writes commit with the omitted record
// rather than roll back and run again on every redelivery).
func TestUnstorableResult(t *testing.T) {
	for _, store := range []string{"memstore", "redis", "postgres"} {
		t.Run(store, func(t *testing.T) {
			ctx := context.Background()
			var r *idempotency.Runner
			count := func() int { return 0 }
			switch store {
			case "memstore":
				r = memRunner(t)
			case "redis":
				c := redis.NewClient(&redis.Options{Addr: redistest.Addr(t)})
				t.Cleanup(func() { _ = c.Close() })
				s := redisstore.New(c, redisstore.WithPrefix(redistest.Prefix()))
				t.Cleanup(func() { _ = s.Close() })
				r = idempotency.NewRunner(s)
			case "postgres":
				var pool *pgxpool.Pool
				r, pool = pgRunner(t, "applied")
				count = func() int { return rows(t, pool, "applied") }
			}
			queue := rabbittest.Queue(t)
			for range 2 {
				publish(t, queue, "k20/1", "p")
			}
			var runs atomic.Int64
			p := idemrabbit.NewProcessor(r, "payments.apply", func(ctx context.Context, d amqp.Delivery) (chan int, error) {
				runs.Add(1)
				if tx, ok := pgstore.TxFromContext(ctx); ok {
					if _, err := tx.Exec(ctx, `INSERT INTO applied VALUES ($1)`, d.MessageId); err != nil {
						return nil, err
					}
				}
				return make(chan int), nil // encoding/json cannot encode a channel
			}, idemrabbit.WithErrorHandler(quiet))
			ds := subscribe(t, queue, 2)
			res, s, err := p.Process(ctx, next(t, ds))
			if s.Action != idemrabbit.Ack || res.Outcome != idempotency.OutcomeOmitted || !errors.Is(err, idempotency.ErrResultOmitted) {
				t.Fatalf("first: %v %+v %v, want an ack of a record stored omitted", res.Outcome, s, err)
			}
			res, s, err = p.Process(ctx, next(t, ds))
			if err != nil || s.Action != idemrabbit.Ack || res.Outcome != idempotency.OutcomeReplayedOmitted {
				t.Fatalf("duplicate: %v %+v %v, want an ack as a replay", res.Outcome, s, err)
			}
			if n := runs.Load(); n != 1 {
				t.Fatalf("the handler ran %d times, want once", n)
			}
			if store == "postgres" && count() != 1 {
				t.Fatalf("%d rows, want 1", count())
			}
		})
	}
}
