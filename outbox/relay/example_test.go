package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/relay"
)

// A relay publishing to a broker that deduplicates by message ID within a
// window (JetStream's Duplicates) must be given a window at least as long
// as the relay's RepublishAfter: the longest time after which it can
// publish again a message the broker had stored. Check it before Run, as
// natsink.CheckDuplicates does; New makes no connection, Run does.
func ExampleRelay_RepublishAfter() {
	pool, err := pgxpool.New(context.Background(), "postgres://127.0.0.1:5432/app")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	sink := outbox.SinkFunc(func(ctx context.Context, e outbox.Envelope) error {
		return nil // publish e with e.ID as its deduplication ID
	})

	r := relay.New(pool, sink,
		relay.WithClaimLease(30*time.Second),
		relay.WithBackoff(time.Second, 5*time.Minute),
		relay.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, nil))),
	)
	window := 2 * time.Minute // a stream created with JetStream's defaults
	fmt.Println("republish after:", r.RepublishAfter())
	if window < r.RepublishAfter() {
		fmt.Printf("the stream's duplicates window (%v) is shorter than the relay's %v\n", window, r.RepublishAfter())
	}
	// Output:
	// republish after: 5m0s
	// the stream's duplicates window (2m0s) is shorter than the relay's 5m0s
}
