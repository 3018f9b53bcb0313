package idempotency

import "testing"

// TestEveryOutcomeHasItsRows: the core's final event and the middleware's
// answer have a row for every Outcome, so that adding an outcome fails here
// until both say what it is.
func TestEveryOutcomeHasItsRows(t *testing.T) {
	for _, o := range Outcomes() {
		if eventKinds[o] == 0 {
			t.Errorf("%v: no final event kind", o)
		}
		if a := outcomeAnswers[o]; a.send == sendProblem && a.status == 0 {
			t.Errorf("%v: no answer of the middleware", o)
		}
	}
}
