package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

// racers is the number of goroutines in each race.
const racers = 200

// race runs f on n goroutines released together and returns their results.
func race[T any](t *testing.T, n int, f func(i int) (T, error)) []T {
	t.Helper()
	results := make([]T, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(n)
	for i := range n {
		go func() {
			defer wg.Done()
			<-start
			results[i], errs[i] = f(i)
		}()
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("racing calls failed: %v", err)
	}
	return results
}

func countOutcomes(as []idempotency.Acquisition) map[idempotency.AcquireOutcome]int {
	n := map[idempotency.AcquireOutcome]int{}
	for _, a := range as {
		n[a.Outcome]++
	}
	return n
}

var concurrencyCases = []testCase{
	{"Acquire", func(t *testing.T, h *harness) {
		key := newKey()
		as := race(t, racers, func(int) (idempotency.Acquisition, error) {
			return h.s.Acquire(h.ctx(), req(key, newToken(), "fp", longLease, longTTL))
		})
		wantOneWinner(t, as, idempotency.Acquired, 1)
	}},
	{"Steal", func(t *testing.T, h *harness) {
		key := newKey()
		h.acquireWant(req(key, newToken(), "fp", shortLease, longTTL), idempotency.Acquired, 1)
		start := time.Now()
		sleepUntil(start.Add(shortLease))
		as := race(t, racers, func(int) (idempotency.Acquisition, error) {
			return h.s.Acquire(h.ctx(), req(key, newToken(), "fp", longLease, longTTL))
		})
		wantOneWinner(t, as, idempotency.Stolen, 2)
	}},
	{"CompleteVersusSteal", func(t *testing.T, h *harness) {
		// A stale owner completes while others try to steal. Exactly one
		// attempt completes, and the payload is that attempt's. Several
		// keys run at once so that both orders are likely to occur.
		const keys, thieves = 20, 10
		type round struct{ key, stale string }
		rounds := make([]round, keys)
		for i := range rounds {
			rounds[i] = round{newKey(), newToken()}
			h.acquireWant(req(rounds[i].key, rounds[i].stale, "fp", shortLease, longTTL), idempotency.Acquired, 1)
		}
		sleepUntil(time.Now().Add(shortLease))

		type result struct {
			round, who int // who: -1 for the stale owner
			outcome    idempotency.AcquireOutcome
			completed  bool
		}
		results := race(t, keys*(thieves+1), func(i int) (result, error) {
			r := rounds[i/(thieves+1)]
			res := result{round: i / (thieves + 1), who: i%(thieves+1) - 1}
			token := r.stale
			if res.who >= 0 {
				token = newToken()
				a, err := h.s.Acquire(h.ctx(), req(r.key, token, "fp", longLease, longTTL))
				if err != nil {
					return res, err
				}
				res.outcome = a.Outcome
				if a.Outcome != idempotency.Stolen {
					return res, nil
				}
			}
			err := h.s.Complete(h.ctx(), r.key, token, sampleResponse(fmt.Sprintf("%d/%d", res.round, res.who)), longTTL)
			switch {
			case err == nil:
				res.completed = true
			case !errors.Is(err, idempotency.ErrLeaseLost):
				return res, err
			}
			return res, nil
		})

		orders := map[bool]int{}
		for i, r := range rounds {
			winners, steals := 0, 0
			winner := 0
			for _, res := range results {
				if res.round != i {
					continue
				}
				if res.outcome == idempotency.Stolen {
					steals++
				}
				if res.completed {
					winners++
					winner = res.who
				}
			}
			if winners != 1 {
				t.Fatalf("key %d: %d attempts completed, want exactly 1", i, winners)
			}
			if steals > 1 || (winner == -1) != (steals == 0) {
				t.Fatalf("key %d: %d steals, completed by attempt %d", i, steals, winner)
			}
			orders[winner == -1]++
			h.wantReplay(r.key, "fp", sampleResponse(fmt.Sprintf("%d/%d", i, winner)))
		}
		t.Logf("stale owner completed first on %d keys, a thief on %d", orders[true], orders[false])
	}},
}

// wantOneWinner fails t unless exactly one of as has the outcome winner,
// every other is InFlight, and all of them report epoch.
func wantOneWinner(t *testing.T, as []idempotency.Acquisition, winner idempotency.AcquireOutcome, epoch uint64) {
	t.Helper()
	n := countOutcomes(as)
	if n[winner] != 1 || n[idempotency.InFlight] != len(as)-1 {
		t.Fatalf("outcomes %v, want exactly one %v and %d in_flight", n, winner, len(as)-1)
	}
	for _, a := range as {
		if a.Epoch != epoch {
			t.Fatalf("%v with epoch %d, want %d", a.Outcome, a.Epoch, epoch)
		}
	}
}
