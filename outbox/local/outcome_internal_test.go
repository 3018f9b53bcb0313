package local

import (
	"errors"
	"fmt"
	"testing"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/internal/runclaim"
)

// TestEveryOutcomeTranslated: the translation table has a row for every
// outcome of Do, and each row tells the relay what the outcome's class
// asks: a run that committed is the run's own done mark, a replay is done
// by the relay, a retry is an error the relay retries, a permanent one a
// refusal. The outcomes that say the function ran without its transaction
// cannot happen (the function never works without one), and are retried.
func TestEveryOutcomeTranslated(t *testing.T) {
	cannotHappen := map[idempotency.Outcome]bool{
		idempotency.OutcomeStored: true, idempotency.OutcomeUnrecorded: true, idempotency.OutcomeUnprotected: true,
	}
	cause := errors.New("the call's error")
	for _, o := range idempotency.Outcomes() {
		v, ok := verdicts[o]
		if !ok {
			t.Errorf("no row for %v", o)
			continue
		}
		got := tell(o, cause)
		switch {
		case v == ran:
			if o.Class() != idempotency.ClassDone || !o.Ran() || !errors.Is(got, runclaim.ErrRan) {
				t.Errorf("%v (%v): told %v", o, o.Class(), got)
			}
		case v == replayed:
			if o.Class() != idempotency.ClassDone || o.Ran() || got != nil {
				t.Errorf("%v (%v): told %v, want nil", o, o.Class(), got)
			}
		case v == refuse:
			if o.Class() != idempotency.ClassPermanent || !errors.Is(got, outbox.ErrPermanent) || !errors.Is(got, cause) {
				t.Errorf("%v (%v): told %v, want a refusal", o, o.Class(), got)
			}
		case v == retry:
			if o.Class() != idempotency.ClassRetry && !cannotHappen[o] || got != cause {
				t.Errorf("%v (%v): told %v, want the call's error as it is", o, o.Class(), got)
			}
		default:
			t.Errorf("%v: verdict %d", o, v)
		}
		if got := tell(o, nil); v != ran && v != replayed && got == nil {
			t.Errorf("%v without an error: told nil, which the relay would take for a confirm", o)
		}
	}
	if len(verdicts) != len(idempotency.Outcomes()) {
		t.Errorf("%d rows for %d outcomes", len(verdicts), len(idempotency.Outcomes()))
	}
}

// TestRan: Ran tells a run's own done mark, wrapped or not, from nil and
// from any failure.
func TestRan(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{tell(idempotency.OutcomeCommitted, nil), true},
		{fmt.Errorf("traced: %w", tell(idempotency.OutcomeCommitted, nil)), true},
		{tell(idempotency.OutcomeReplayed, nil), false},
		{tell(idempotency.OutcomeReleased, errors.New("failed")), false},
		{outbox.Suspend(noTransaction), false},
	} {
		if got := Ran(tc.err); got != tc.want {
			t.Errorf("Ran(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
