package idemrabbit

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/go-idempotency/idempotency"
)

// TestEveryOutcomeHasASettlement: the table has a row for every outcome
// the core reports, and each row settles as the outcome's class asks: a
// done call is acked, a permanent failure rejected, and a call to retry
// is kept (waiting for the holder) or requeued, never acked nor rejected.
func TestEveryOutcomeHasASettlement(t *testing.T) {
	for _, o := range idempotency.Outcomes() {
		r, ok := settlements[o]
		if !ok {
			t.Errorf("%v has no row in the table", o)
			continue
		}
		want := map[idempotency.Class][]disposition{
			idempotency.ClassDone:      {ack},
			idempotency.ClassRetry:     {retry, wait},
			idempotency.ClassPermanent: {reject},
		}[o.Class()]
		found := false
		for _, d := range want {
			found = found || r.action == d
		}
		if !found {
			t.Errorf("%v (%v) settles as %d", o, o.Class(), r.action)
		}
		if r.action == wait && o != idempotency.OutcomeInFlight {
			t.Errorf("%v waits for a holder it does not have", o)
		}
	}
	if len(settlements) != len(idempotency.Outcomes()) {
		t.Errorf("the table has %d rows for %d outcomes", len(settlements), len(idempotency.Outcomes()))
	}
}

// TestDeliveryNumber: a quorum queue's x-delivery-count counts the
// deliveries before; without it, Redelivered says whether there was one.
func TestDeliveryNumber(t *testing.T) {
	for _, c := range []struct {
		d    amqp.Delivery
		want int
	}{
		{amqp.Delivery{}, 1},
		{amqp.Delivery{Redelivered: true}, 2},
		{amqp.Delivery{Redelivered: true, Headers: amqp.Table{DeliveryCountHeader: int64(3)}}, 4},
		{amqp.Delivery{Redelivered: true, Headers: amqp.Table{DeliveryCountHeader: int32(1)}}, 2},
		{amqp.Delivery{Redelivered: true, Headers: amqp.Table{DeliveryCountHeader: "7"}}, 2},
	} {
		if got := deliveryNumber(c.d); got != c.want {
			t.Errorf("%+v: delivery %d, want %d", c.d, got, c.want)
		}
	}
}

// TestBackoff: the n-th delivery is held within the upper half of base
// doubled n-1 times, up to the cap, and at least the outcome's
// RetryAfter; each step lies above the one before until the cap.
func TestBackoff(t *testing.T) {
	c := newProcessorConfig([]ProcessorOption{WithBackoff(100*time.Millisecond, time.Second)})
	for range 100 {
		prev := time.Duration(0)
		for n, step := range []time.Duration{100, 200, 400, 800, 1000, 1000, 1000} {
			step *= time.Millisecond
			d := c.backoff(n+1, 0)
			if d < step/2 || d >= step {
				t.Fatalf("delivery %d: %v, want [%v, %v)", n+1, d, step/2, step)
			}
			if step < time.Second && d <= prev {
				t.Fatalf("delivery %d: %v, not above %v", n+1, d, prev)
			}
			prev = d
		}
	}
	if d := c.backoff(1, 3*time.Second); d != 3*time.Second {
		t.Fatalf("with RetryAfter 3s: %v", d)
	}
	if d := c.backoff(1<<30, 0); d < 500*time.Millisecond || d >= time.Second {
		t.Fatalf("far past the cap: %v", d)
	}
}

// TestLast: with x-delivery-limit 3 a quorum queue delivers a message 4
// times; the 4th is the last.
func TestLast(t *testing.T) {
	c := newProcessorConfig([]ProcessorOption{WithDeliveryLimit(3)})
	for n, want := range []bool{false, false, false, true, true} {
		if got := c.last(n + 1); got != want {
			t.Errorf("delivery %d: last %v, want %v", n+1, got, want)
		}
	}
	none, zero := newProcessorConfig(nil), newProcessorConfig([]ProcessorOption{WithDeliveryLimit(0)})
	if none.last(1 << 20) {
		t.Error("a Processor without a limit saw a last delivery")
	}
	if !zero.last(1) {
		t.Error("with limit 0, the first delivery is not the last")
	}
}
