package outboxproof_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/go-idempotency/idempotency/brokers/nats/natsink"
	"github.com/go-idempotency/idempotency/brokers/nats/natstest"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/relay"
)

// TestRelayChecksDuplicateWindow: an in-process relay's RepublishAfter is
// what natsink.WindowNeeded computes from its settings, and
// natsink.CheckDuplicates with it refuses a stream created with
// JetStream's default Duplicates window (2 minutes) against the relay's
// defaults (5 minutes), naming both; a stream with a longer window passes.
func TestRelayChecksDuplicateWindow(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none") // relay.New makes no connection
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	sink := outbox.SinkFunc(func(context.Context, outbox.Envelope) error { return nil })
	defaults := relay.New(pool, sink)
	short := relay.New(pool, sink, relay.WithClaimLease(2*time.Second), relay.WithPollInterval(200*time.Millisecond), relay.WithBackoff(time.Second, time.Second))
	if got, want := defaults.RepublishAfter(), natsink.WindowNeeded(30*time.Second, 5*time.Second, 5*time.Minute); got != want {
		t.Errorf("the defaults' RepublishAfter() = %v, natsink.WindowNeeded %v", got, want)
	}
	if got, want := short.RepublishAfter(), natsink.WindowNeeded(2*time.Second, 200*time.Millisecond, time.Second); got != want {
		t.Errorf("RepublishAfter() = %v, natsink.WindowNeeded %v", got, want)
	}

	_, js := natstest.Connect(t, natstest.URL(t))
	id := randomID(t)
	stream := "WINDOW_" + strings.ToUpper(id)
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: stream, Subjects: []string{"window." + id}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
	err = natsink.CheckDuplicates(context.Background(), js, stream, defaults.RepublishAfter())
	if !errors.Is(err, natsink.ErrWindowTooShort) || !strings.Contains(err.Error(), "2m0s") || !strings.Contains(err.Error(), "5m0s") {
		t.Errorf("a default stream against the relay's defaults: %v, want ErrWindowTooShort naming 2m0s and 5m0s", err)
	}
	if err := natsink.CheckDuplicates(context.Background(), js, stream, short.RepublishAfter()); err != nil {
		t.Errorf("a default stream against a relay that needs %v: %v", short.RepublishAfter(), err)
	}
}
