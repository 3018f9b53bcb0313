package natsink_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/brokers/nats/natsink"
	"github.com/go-idempotency/idempotency/brokers/nats/natstest"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/relay"
	"github.com/go-idempotency/idempotency/pgstore"
)

// TestInvalidSubjectRefusedPermanently: a subject no publication can go to
// is a permanent refusal (outbox.ErrPermanent); a subject the stream does
// not capture is not (a stream may appear).
func TestInvalidSubjectRefusedPermanently(t *testing.T) {
	_, js := natstest.Connect(t, natstest.URL(t))
	stream, prefix := newStream(t, js, 0)
	sink := natsink.New(js, natsink.WithStream(stream), natsink.WithTimeout(2*time.Second))
	for _, subject := range []string{"", prefix + "bad subject", prefix + "tab\there", prefix + "a..b", prefix + "*", prefix + ">", "." + prefix + "a", prefix + "a."} {
		err := sink.Publish(context.Background(), envelope("k/1", subject, "p"))
		if !errors.Is(err, outbox.ErrPermanent) {
			t.Errorf("subject %q: %v, want a permanent refusal", subject, err)
		}
		if subject != "" && !errors.Is(err, nats.ErrBadSubject) {
			t.Errorf("subject %q: %v, want nats.ErrBadSubject", subject, err)
		}
	}
	err := sink.Publish(context.Background(), envelope("k/1", "elsewhere."+prefix+"x", "p"))
	if err == nil || errors.Is(err, outbox.ErrPermanent) {
		t.Errorf("a subject outside the stream: %v, want an error to retry", err)
	}
}

// TestRelayRefusedMessageDead: a message whose topic natsink refuses (a
// space in it, written by another producer, since Enqueue refuses it) is
// dead after one attempt, with natsink's error as its last error; the
// healthy messages, one of its own ordering key among them, reach the
// stream.
func TestRelayRefusedMessageDead(t *testing.T) {
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

	var ids []string
	for i := range 4 {
		res, err := idempotency.Do(ctx, runner, idempotency.Call{Name: "pay", Key: fmt.Sprint("order-", i)}, func(ctx context.Context) ([]string, error) {
			return outbox.Enqueue(ctx, outbox.Message{Topic: prefix + "payment.created"}, outbox.Message{Topic: prefix + "payment.audit"})
		})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.Value...)
	}
	bad := ids[0]
	key, seq, _ := outbox.ParseID(bad)
	if _, err := pool.Exec(ctx, `UPDATE idempotency_outbox SET topic = $3 WHERE storage_key = $1 AND seq = $2`, key, seq, prefix+"payment created"); err != nil {
		t.Fatal(err)
	}
	refused := make(chan relay.Event, 1)
	r := relay.New(pool, natsink.New(js, natsink.WithStream(stream)), relay.WithPollInterval(100*time.Millisecond),
		relay.WithMaxAttempts(25), relay.WithObserver(func(_ context.Context, e relay.Event) {
			if e.Kind == relay.EventRefused {
				refused <- e
			}
		}))
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() {
		stop()
		<-done
	}()

	select {
	case e := <-refused:
		if e.ID != bad || e.Attempt != 1 || !errors.Is(e.Err, nats.ErrBadSubject) {
			t.Errorf("refused event %+v", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the message was not refused")
	}
	var status, lastError string
	var attempts int
	if err := pool.QueryRow(ctx, `SELECT status, attempts, last_error FROM idempotency_outbox WHERE storage_key = $1 AND seq = $2`, key, seq).
		Scan(&status, &attempts, &lastError); err != nil {
		t.Fatal(err)
	}
	if status != "dead" || attempts != 1 || !strings.HasPrefix(lastError, relay.CodeRefused+": natsink: message "+bad) ||
		!strings.Contains(lastError, "invalid subject") {
		t.Errorf("the refused message: %s after %d attempts, last error %q", status, attempts, lastError)
	}

	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for range ids[1:] {
		msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatalf("after %d of %d messages: %v", len(seen), len(ids)-1, err)
		}
		seen[msg.Headers().Get(jetstream.MsgIDHeader)]++
	}
	for _, id := range ids[1:] {
		if seen[id] != 1 {
			t.Errorf("%s is in the stream %d times", id, seen[id])
		}
	}
	if seen[bad] != 0 {
		t.Errorf("the refused message is in the stream")
	}
}
