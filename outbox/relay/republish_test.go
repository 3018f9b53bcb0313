package relay_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency/internal/outboxtest"
	"github.com/go-idempotency/idempotency/outbox/relay"
)

// TestRepublishAfter: the longest time after which a relay can publish a
// stored message again is the claim lease plus the poll interval, or the
// backoff cap, whichever is longer: 5 minutes with the defaults, which a
// stream's default 2-minute Duplicates window does not cover.
func TestRepublishAfter(t *testing.T) {
	pool, err := pgxpool.New(ctx, "postgres://nobody@127.0.0.1:1/none") // New makes no connection
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	sink := outboxtest.NewRecorder()
	for _, c := range []struct {
		opts []relay.Option
		want time.Duration
	}{
		{nil, 5 * time.Minute},
		{[]relay.Option{relay.WithBackoff(time.Second, time.Minute)}, time.Minute},
		{[]relay.Option{relay.WithBackoff(time.Second, time.Minute), relay.WithClaimLease(2 * time.Minute), relay.WithPollInterval(30 * time.Second)}, 150 * time.Second},
		{[]relay.Option{relay.WithBackoff(time.Second, time.Second), relay.WithClaimLease(2 * time.Second), relay.WithPollInterval(200 * time.Millisecond)}, 2200 * time.Millisecond},
	} {
		if got := relay.New(pool, sink, c.opts...).RepublishAfter(); got != c.want {
			t.Errorf("RepublishAfter() = %v with %d options, want %v", got, len(c.opts), c.want)
		}
	}
}
