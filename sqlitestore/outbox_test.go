package sqlitestore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/outboxtest"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/outbox/relay"
	"github.com/go-idempotency/idempotency/sqlitestore"
)

// runRelay runs s's relay through sink until t ends, and returns its
// events.
func runRelay(t *testing.T, s *sqlitestore.Store, sink outbox.Sink, opts ...relay.Option) *outboxtest.Events {
	t.Helper()
	return outboxtest.Start(t, func(opts ...relay.Option) *relay.Relay { return s.Relay(sink, opts...) }, opts...)
}

// TestOutboxCommitsWithRecord: messages enqueued in a transactional call
// commit with its record and reach the sink once each, woken in process
// (the poll is an hour); a call that fails leaves none.
func TestOutboxCommitsWithRecord(t *testing.T) {
	s := open(t, newPath(t))
	runner := idempotency.NewRunner(s, idempotency.WithTransaction(true))
	rec := outboxtest.NewRecorder()
	runRelay(t, s, rec, relay.WithPollInterval(time.Hour))

	var ids []string
	for i := range 20 {
		got, err := idempotency.Do(context.Background(), runner, idempotency.Call{Name: "pay", Key: fmt.Sprint("k", i)},
			func(ctx context.Context) ([]string, error) {
				return outbox.Enqueue(ctx,
					outbox.Message{Topic: "payments.captured", Payload: fmt.Appendf(nil, "%d", i)},
					outbox.Message{Topic: "ledger", Payload: []byte{0, 1, 2, 255}, Headers: map[string]string{"k": "v"}, OrderingKey: "acct"})
			})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, got.Value...)
	}
	failed := errors.New("declined")
	_, err := idempotency.Do(context.Background(), runner, idempotency.Call{Name: "pay", Key: "failing"},
		func(ctx context.Context) ([]string, error) {
			if _, err := outbox.Enqueue(ctx, outbox.Message{Topic: "never", Payload: []byte("x")}); err != nil {
				return nil, err
			}
			return nil, failed
		})
	if !errors.Is(err, failed) {
		t.Fatalf("Do: %v, want %v", err, failed)
	}

	if err := rec.AwaitIDs(10*time.Second, ids...); err != nil {
		t.Fatal(err)
	}
	rec.ExpectOnceEach(t, ids)
	for _, d := range rec.Deliveries() {
		if d.Envelope.Topic == "never" {
			t.Errorf("the failed call's message was published: %v", d.Envelope.ID)
		}
		if d.Envelope.Topic == "ledger" && (d.Envelope.Headers["k"] != "v" || string(d.Envelope.Payload) != "\x00\x01\x02\xff") {
			t.Errorf("%s: headers %v, payload %q", d.Envelope.ID, d.Envelope.Headers, d.Envelope.Payload)
		}
	}
	table, err := lifecycle.New(sqlitestore.DefaultOutboxTable, lifecycle.SQLite)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "every message done", func() bool {
		st, err := table.Status(context.Background(), s.OutboxDB(), 5)
		return err == nil && st.Counts[lifecycle.Done] == int64(len(ids)) && st.Total == int64(len(ids))
	})
}

// TestOperatorEdgeWakesRelay: an operator's resume through OutboxDB wakes
// the Store's relay at once (its poll is an hour), as a commit of messages
// does.
func TestOperatorEdgeWakesRelay(t *testing.T) {
	s := open(t, newPath(t))
	ctx := context.Background()
	runner := idempotency.NewRunner(s, idempotency.WithTransaction(true))
	table, err := lifecycle.New(sqlitestore.DefaultOutboxTable, lifecycle.SQLite)
	if err != nil {
		t.Fatal(err)
	}
	res, err := idempotency.Do(ctx, runner, idempotency.Call{Name: "pay", Key: "k"}, func(ctx context.Context) ([]string, error) {
		ids, err := outbox.Enqueue(ctx, outbox.Message{Topic: "held", Payload: []byte("x")})
		if err != nil {
			return nil, err
		}
		// Held before the relay starts.
		db, tb := sqlitestoreOutbox(ctx)
		_, err = tb.Suspend(ctx, db, lifecycle.Selector{IDs: ids}, "held by the test")
		return ids, err
	})
	if err != nil {
		t.Fatal(err)
	}
	rec := outboxtest.NewRecorder()
	ev := runRelay(t, s, rec, relay.WithPollInterval(time.Hour))
	ev.Await(t, 10*time.Second, "the relay idle", func() bool { return len(ev.Of(relay.EventLag)) > 0 })
	if rec.Count(res.Value[0]) != 0 {
		t.Fatal("a suspended message was published")
	}
	if _, err := table.Resume(ctx, s.OutboxDB(), lifecycle.Selector{IDs: res.Value}); err != nil {
		t.Fatal(err)
	}
	if err := rec.AwaitIDs(10*time.Second, res.Value...); err != nil {
		t.Fatal(err)
	}
}

// sqlitestoreOutbox returns the outbox of the transactional call whose
// context ctx is.
func sqlitestoreOutbox(ctx context.Context) (lifecycle.DB, *lifecycle.Table) {
	tx, _ := sqlitestore.TxFromContext(ctx)
	return tx.Outbox()
}
