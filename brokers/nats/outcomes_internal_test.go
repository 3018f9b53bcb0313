package idemnats

import (
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

// TestOutcomeTable: every outcome the core reports has a row in the one
// translation table, and each row agrees with the outcome's class: what
// is done is acked, what may succeed later is naked, what never will is
// termed.
func TestOutcomeTable(t *testing.T) {
	want := map[idempotency.Class][]settlement{
		idempotency.ClassDone:      {ack, ackQuiet},
		idempotency.ClassRetry:     {nak, nakQuiet},
		idempotency.ClassPermanent: {term},
	}
	for _, o := range idempotency.Outcomes() {
		s, ok := settlements[o]
		if !ok {
			t.Errorf("no row for %v", o)
			continue
		}
		agrees := false
		for _, w := range want[o.Class()] {
			agrees = agrees || s == w
		}
		if !agrees {
			t.Errorf("%v (class %v) is settled as %d, want one of %v", o, o.Class(), s, want[o.Class()])
		}
	}
	if len(settlements) != len(idempotency.Outcomes()) {
		t.Errorf("%d rows for %d outcomes", len(settlements), len(idempotency.Outcomes()))
	}
}

// TestBackoff: a nak's delay doubles with each delivery from the base,
// less under half of it, strictly longer each time until the limit, which
// it never passes; it is never zero, and a delivery count far past what
// doubling can reach stays at the limit.
func TestBackoff(t *testing.T) {
	for _, tc := range []struct {
		base, limit time.Duration
	}{
		{time.Second, 5 * time.Minute},
		{10 * time.Millisecond, 80 * time.Millisecond},
		{time.Second, 300 * time.Millisecond}, // a limit under the base caps the base
		{time.Nanosecond, time.Duration(1<<63 - 1)},
	} {
		for range 50 { // the jitter is random: try it often
			prev := time.Duration(0)
			for n := uint64(1); n <= 80; n++ {
				d := backoff(n, tc.base, tc.limit)
				full := min(tc.base, tc.limit)
				for range n - 1 {
					full = min(full*2, tc.limit)
					if full < 0 { // overflowed
						full = tc.limit
					}
				}
				if d > full || d <= full/2 && full > 1 || d <= 0 {
					t.Fatalf("base %v, limit %v: delivery %d waits %v, want in (%v, %v]", tc.base, tc.limit, n, d, full/2, full)
				}
				if full < tc.limit && d <= prev {
					t.Fatalf("base %v, limit %v: delivery %d waits %v, not longer than the delivery before (%v)", tc.base, tc.limit, n, d, prev)
				}
				prev = d
			}
		}
	}
	if d := backoff(1<<63, time.Second, time.Minute); d > time.Minute || d <= 30*time.Second {
		t.Fatalf("a huge delivery count waits %v", d)
	}
}

// TestHonoursTermReason: a term carries a reason only for a server known
// to honour it (2.10.4 and later); anything else, this machine's 2.9.10
// included, gets a plain term.
func TestHonoursTermReason(t *testing.T) {
	for v, want := range map[string]bool{
		"2.9.10": false, "2.10.3": false, "2.10.4-beta.2": false, "2.10.4": true, "2.10.22": true,
		"2.11.0": true, "3.0.0": true, "1.99.99": false, "": false, "2.10": false, "v2.10.4": false, "2.x.4": false,
	} {
		if got := honoursTermReason(v); got != want {
			t.Errorf("honoursTermReason(%q) = %v, want %v", v, got, want)
		}
	}
}
