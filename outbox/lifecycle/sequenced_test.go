package lifecycle_test

import (
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/outbox/lifecycle"
)

// TestInsertSequenced: messages enqueued at sequences their writer chose,
// from a row source of another statement, are ready at once, read back by
// Messages in id order, presented one at a time per ordering key; a
// sequence written twice is refused by the unique index.
func TestInsertSequenced(t *testing.T) {
	f := newFixture(t)
	insert := `WITH message AS (
	SELECT $1::text AS storage_key, $2::integer AS seq, $3::text AS topic, $4::bytea AS payload,
		$5::text AS headers, $6::text AS ordering_key, clock_timestamp() AS enqueued_at
)
` + f.t.InsertSequenced("message")
	for _, seq := range []int{2, 3} {
		if _, err := f.Pool.Exec(ctx, insert, "rec", seq, "state.payment", []byte(`{"v":1}`), `{"traceparent":"x"}`, "acme/payment/1"); err != nil {
			t.Fatalf("insert %d: %v", seq, err)
		}
	}
	_, err := f.Pool.Exec(ctx, insert, "rec", 2, "state.payment", []byte(`{}`), `{}`, "acme/payment/1")
	if !lifecycle.PostgreSQL.UniqueViolation(err) {
		t.Errorf("a sequence written twice: %v, want a unique violation", err)
	}

	msgs, err := f.t.Messages(ctx, f.Pool, "rec")
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 2 || msgs[0].ID != "rec/2" || msgs[1].ID != "rec/3" || msgs[0].RowID >= msgs[1].RowID {
		t.Fatalf("messages %+v", msgs)
	}
	for _, m := range msgs {
		if m.State != lifecycle.Ready || m.Topic != "state.payment" || m.Headers["traceparent"] != "x" ||
			m.OrderingKey != "acme/payment/1" || string(m.Payload) != `{"v":1}` || m.EnqueuedAt.IsZero() {
			t.Errorf("message %+v", m)
		}
	}
	if others, err := f.t.Messages(ctx, f.Pool, "other"); err != nil || len(others) != 0 {
		t.Errorf("another key's messages: %+v, %v", others, err)
	}

	claimed, err := f.t.Claim(ctx, f.Pool, "tok-1", "relay", time.Minute, 10)
	if err != nil || len(claimed) != 1 || claimed[0].ID != "rec/2" {
		t.Fatalf("first claim: %+v, %v; want rec/2 alone", claimed, err)
	}
	if _, err := f.t.Done(ctx, f.Pool, "tok-1", []int64{claimed[0].RowID}); err != nil {
		t.Fatal(err)
	}
	claimed, err = f.t.Claim(ctx, f.Pool, "tok-2", "relay", time.Minute, 10)
	if err != nil || len(claimed) != 1 || claimed[0].ID != "rec/3" {
		t.Fatalf("second claim: %+v, %v; want rec/3", claimed, err)
	}
}
