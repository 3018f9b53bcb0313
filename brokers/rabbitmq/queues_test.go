package idemrabbit_test

import (
	"context"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/brokers/rabbitmq/rabbittest"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/memstore"
	"github.com/go-idempotency/idempotency/pgstore"
)

// memRunner returns a Runner on a memstore of t's own.
func memRunner(t testing.TB, opts ...idempotency.RunnerOption) *idempotency.Runner {
	t.Helper()
	s := memstore.New()
	t.Cleanup(func() { _ = s.Close() })
	return idempotency.NewRunner(s, opts...)
}

// quorumQueue declares a quorum queue of t's own, under a random name,
// with x-delivery-limit limit (none when limit is negative), and a classic
// queue, its dead-letter queue, that gets what it dead-letters (rejected
// without requeue, or past the limit). Both are deleted when t ends.
func quorumQueue(t testing.TB, limit int) (queue, dlq string) {
	t.Helper()
	queue = rabbittest.QueuePrefix + "quorum." + strings.ToLower(rand.Text())
	dlq = queue + ".dlq"
	args := amqp.Table{
		"x-queue-type":              "quorum",
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": dlq,
	}
	if limit >= 0 {
		args["x-delivery-limit"] = limit
	}
	ch := rabbittest.Channel(t)
	if _, err := ch.QueueDeclare(dlq, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteQueues(t, queue, dlq) })
	if _, err := ch.QueueDeclare(queue, true, false, false, false, args); err != nil {
		t.Fatal(err)
	}
	return queue, dlq
}

// deleteQueues deletes the queues from a connection of its own, so that
// they go even after the test's connections broke.
func deleteQueues(t testing.TB, queues ...string) {
	conn, err := amqp.Dial(rabbittest.URL(t))
	if err != nil {
		t.Errorf("deleting queues %v: %v", queues, err)
		return
	}
	defer conn.Close()
	for _, q := range queues {
		ch, err := conn.Channel()
		if err == nil {
			_, err = ch.QueueDelete(q, false, false, false)
			_ = ch.Close()
		}
		if err != nil {
			t.Errorf("deleting queue %s: %v", q, err)
		}
	}
}

// publish publishes a persistent message with message_id id and body to
// queue through the default exchange, and returns once the broker
// confirmed it.
func publish(t testing.TB, queue, id, body string) {
	t.Helper()
	ch := rabbittest.Channel(t)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, amqp.Publishing{
		MessageId: id, Body: []byte(body), DeliveryMode: amqp.Persistent,
	})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := conf.WaitContext(ctx); !ok || err != nil {
		t.Fatalf("publication of %s not confirmed: %v", id, err)
	}
}

// subscribe returns the deliveries of queue to a consumer of its own, with
// manual acks and at most prefetch deliveries unacked, on a channel of its
// own.
func subscribe(t testing.TB, queue string, prefetch int) <-chan amqp.Delivery {
	t.Helper()
	ch := rabbittest.Channel(t)
	if err := ch.Qos(prefetch, 0, false); err != nil {
		t.Fatal(err)
	}
	return consumeOn(t, ch, queue)
}

// pgRunner returns a transactional Runner on a pgstore in a database of
// t's own, with a table of message IDs the handlers write, and its pool.
func pgRunner(t testing.TB, table string, opts ...idempotency.RunnerOption) (*idempotency.Runner, *pgxpool.Pool) {
	t.Helper()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (message_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	store := pgstore.New(pool)
	t.Cleanup(func() { _ = store.Close() })
	return idempotency.NewRunner(store, append([]idempotency.RunnerOption{idempotency.WithTransaction(true)}, opts...)...), pool
}

// rows returns the number of rows of table.
func rows(t testing.TB, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// ready returns the number of messages ready in queue.
func ready(t testing.TB, queue string) int {
	t.Helper()
	q, err := rabbittest.Channel(t).QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}
