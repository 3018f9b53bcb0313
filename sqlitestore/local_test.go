package sqlitestore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/outbox/local"
	"github.com/go-idempotency/idempotency/outbox/relay"
	"github.com/go-idempotency/idempotency/sqlitestore"
)

// TestLocalRunsOnce: a local sink (package outbox/local) on the file runs
// each message's work once: the work's row, its record and the message's
// done mark commit in one transaction of the file, also when the work
// fails once first.
func TestLocalRunsOnce(t *testing.T) {
	s := open(t, newPath(t))
	ctx := context.Background()
	if _, err := s.DB().ExecContext(ctx, `CREATE TABLE effects (message_id TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	runner := idempotency.NewRunner(s, idempotency.WithTransaction(true))
	failed := map[string]bool{}
	sink := local.Sink(runner, func(ctx context.Context, e outbox.Envelope) error {
		tx, ok := sqlitestore.TxFromContext(ctx)
		if !ok {
			return fmt.Errorf("no transaction")
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO effects (message_id) VALUES (?)`, e.ID); err != nil {
			return err
		}
		if !failed[e.ID] { // the work's first run fails after its write: rolled back
			failed[e.ID] = true
			return fmt.Errorf("first run of %s fails", e.ID)
		}
		return nil
	})
	var ids []string
	for i := range 10 {
		res, err := idempotency.Do(ctx, runner, idempotency.Call{Name: "order", Key: fmt.Sprint("o", i)}, func(ctx context.Context) ([]string, error) {
			return outbox.Enqueue(ctx, outbox.Message{Topic: "orders.capture", Payload: fmt.Appendf(nil, "%d", i)})
		})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.Value...)
	}
	ev := runRelay(t, s, sink, relay.WithPollInterval(20*time.Millisecond))
	defer func() {
		if t.Failed() {
			for _, e := range ev.Of(relay.EventError) {
				t.Logf("event %+v", e)
			}
			for _, k := range []relay.EventKind{relay.EventRetried, relay.EventDead, relay.EventSuspended, relay.EventPublished} {
				t.Logf("%v: %d", k, len(ev.Of(k)))
				for i, e := range ev.Of(k) {
					if i < 2 {
						t.Logf("  %+v", e)
					}
				}
			}
		}
	}()
	table, err := lifecycle.New(sqlitestore.DefaultOutboxTable, lifecycle.SQLite)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "every message done", func() bool {
		st, err := table.Status(ctx, s.OutboxDB(), 5)
		return err == nil && st.Counts[lifecycle.Done] == int64(len(ids))
	})
	rows, err := s.DB().QueryContext(ctx, `SELECT message_id, count(*) FROM effects GROUP BY message_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	seen := 0
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		seen++
		if n != 1 {
			t.Errorf("%s: %d effect rows, want 1", id, n)
		}
	}
	if seen != len(ids) {
		t.Errorf("effects of %d messages, want %d", seen, len(ids))
	}
}
