package relay_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency/internal/outboxtest"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/relay"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	os.Exit(m.Run())
}

// events collects a relay's events.
type events = outboxtest.Events

// start runs a relay on pool through sink until t ends, with a fast
// backoff unless opts set one, and returns its events.
func start(t testing.TB, pool *pgxpool.Pool, sink outbox.Sink, opts ...relay.Option) *events {
	t.Helper()
	return outboxtest.Start(t, func(o ...relay.Option) *relay.Relay { return relay.New(pool, sink, o...) }, opts...)
}

// enqueueRecords enqueues n records of one message each (topic "t"),
// and returns the messages' IDs.
func enqueueRecords(t testing.TB, db *outboxtest.DB, prefix string, n int) []string {
	t.Helper()
	ids := make([]string, 0, n)
	for i := range n {
		ids = append(ids, db.Enqueue(t, fmt.Sprintf("%s-%d", prefix, i), outbox.Message{Topic: "t"})...)
	}
	return ids
}
