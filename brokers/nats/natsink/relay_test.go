package natsink_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/brokers/nats/natsink"
	"github.com/go-idempotency/idempotency/brokers/nats/natstest"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/relay"
	"github.com/go-idempotency/idempotency/pgstore"
)

// TestRelay: messages enqueued by transactional calls reach the stream
// through a relay, once each, with their IDs as Nats-Msg-Id; a call that
// rolled back sends nothing, and its key's retry sends its own.
func TestRelay(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	store := pgstore.New(pool)
	t.Cleanup(func() { _ = store.Close() })
	runner := idempotency.NewRunner(store, idempotency.WithTransaction(true))

	_, js := natstest.Connect(t, natstest.URL(t))
	stream, prefix := newStream(t, js, 0)
	r := relay.New(pool, natsink.New(js, natsink.WithStream(stream)), relay.WithPollInterval(100*time.Millisecond))
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() {
		stop()
		<-done
	}()

	declined := errors.New("declined")
	var ids []string
	for i := range 20 {
		call := idempotency.Call{Name: "pay", Key: fmt.Sprint("order-", i), Payload: []byte{byte(i)}}
		for attempt := range 2 { // the first attempt of every fifth key rolls back
			_, err := idempotency.Do(ctx, runner, call, func(ctx context.Context) (string, error) {
				got, err := outbox.Enqueue(ctx, outbox.Message{Topic: prefix + "payment.created", Payload: []byte(call.Key)})
				if err != nil {
					return "", err
				}
				if i%5 == 0 && attempt == 0 {
					return "", declined
				}
				ids = append(ids, got...)
				return "ok", nil
			})
			if err == nil {
				break
			}
			if !errors.Is(err, declined) {
				t.Fatal(err)
			}
		}
	}

	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for range ids {
		msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatalf("after %d of %d messages: %v", len(seen), len(ids), err)
		}
		seen[msg.Headers().Get(jetstream.MsgIDHeader)]++
	}
	for _, id := range ids {
		if seen[id] != 1 {
			t.Errorf("%s is in the stream %d times", id, seen[id])
		}
	}
	if n := messages(t, js, stream); n != uint64(len(ids)) {
		t.Fatalf("the stream holds %d messages, want %d", n, len(ids))
	}
}
