package statetest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/go-idempotency/idempotency/state"
)

var concurrencyTests = []test{
	{"OneWinner", func(t *testing.T, tg Target) {
		// Transitions racing from one version, each to a state of its
		// own: one wins; every other is a version conflict carrying the
		// winner's record; one event, one history row.
		const racers = 8
		s := tg.NewStore()
		r := ref(t, "pay_1")
		create(t, s, r, "authorized", "")
		start := make(chan struct{})
		type result struct {
			rec state.Record
			err error
		}
		results := make(chan result, racers)
		var wg sync.WaitGroup
		for i := range racers {
			wg.Go(func() {
				<-start
				rec, err := s.Transition(ctx, r, state.Change{From: "authorized", To: fmt.Sprint("s", i), ExpectedVersion: 1})
				results <- result{rec, err}
			})
		}
		close(start)
		wg.Wait()
		close(results)
		var won []state.Record
		var lost []*state.ConflictError
		for res := range results {
			var c *state.ConflictError
			switch {
			case res.err == nil:
				won = append(won, res.rec)
			case errors.As(res.err, &c):
				lost = append(lost, c)
			default:
				t.Errorf("a racer: %v", res.err)
			}
		}
		if len(won) != 1 {
			t.Fatalf("%d racers won, want 1", len(won))
		}
		for _, c := range lost {
			if c.Reason != state.ReasonVersion {
				t.Errorf("a loser's reason %q, want %q", c.Reason, state.ReasonVersion)
			}
			sameRecord(t, "a loser's current record", c.Current, won[0])
		}
		wantWritten(t, "after the race", s, r, 1)
	}},
	{"Linearizable", func(t *testing.T, tg Target) {
		// Clients creating, reading and moving two records at once, with
		// versions they saw or stale ones, and data or none: the history
		// of their calls is linearizable against a model of the records.
		s := tg.NewStore()
		h := runHistory(t, s, scope(t), rand.Uint64())
		counts := map[answer]int{}
		for _, op := range h {
			counts[op.Output.(linOut).answer]++
		}
		t.Logf("%d calls: %d ok, %d exists, %d not found, %d version conflicts, %d state conflicts", len(h),
			counts[answerOK], counts[answerExists], counts[answerNotFound], counts[answerConflictVersion], counts[answerConflictState])
		res, info := porcupine.CheckOperationsVerbose(recordModel, h, 30*time.Second)
		if res != porcupine.Ok {
			t.Errorf("%d operations: %v", len(h), res)
			if res == porcupine.Illegal {
				if path, err := visualize(info); err == nil {
					t.Logf("history drawn to %s", path)
				}
			}
		}
	}},
}
