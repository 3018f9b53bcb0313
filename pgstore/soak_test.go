package pgstore_test

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/reliability"
)

// SoakEnv names the environment variable that lengthens the soak, for
// example IDEMPOTENCY_SOAK=5m (the reliability scenarios read it too).
const soakEnv = "IDEMPOTENCY_SOAK"

const defaultSoak = 3 * time.Second

func soakDuration(t *testing.T) time.Duration {
	t.Helper()
	v := os.Getenv(soakEnv)
	if v == "" {
		return defaultSoak
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a positive duration such as 5m", soakEnv, v)
	}
	return d
}

// soakTally is what the soak's clients got.
type soakTally struct {
	requests, fresh, replays, conflicts, failed, panicked, unavailable, injected atomic.Int64

	mu         sync.Mutex
	keys       []string
	first      map[string]string   // key -> its fresh answer
	replayed   map[string][]string // key -> the bodies replayed
	violations []string
}

func (s *soakTally) violate(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.violations) < 50 {
		s.violations = append(s.violations, fmt.Sprintf(format, args...))
	}
}

// record checks one answer to a request for key; outcome is the
// X-Outcome the request carried ("", "fail" or "panic").
func (s *soakTally) record(key, outcome string, a answer) {
	s.requests.Add(1)
	switch {
	case a.err != nil && outcome == "panic":
		s.panicked.Add(1) // the server aborted the response
	case a.err != nil:
		s.violate("%s: %v", key, a.err)
	case a.status == http.StatusCreated && a.replayed:
		s.replays.Add(1)
		s.mu.Lock()
		s.replayed[key] = append(s.replayed[key], a.body)
		s.mu.Unlock()
	case a.status == http.StatusCreated:
		s.fresh.Add(1)
		s.mu.Lock()
		if prev, ok := s.first[key]; ok {
			s.violations = append(s.violations, fmt.Sprintf("second fresh answer for %s: %q after %q", key, a.body, prev))
		}
		s.first[key] = a.body
		s.mu.Unlock()
	case a.status == http.StatusConflict && a.code == string(idempotency.CodeInFlight):
		s.conflicts.Add(1)
	case a.status == http.StatusBadGateway && outcome == "fail":
		s.failed.Add(1)
	case a.status == http.StatusServiceUnavailable && (a.code == string(idempotency.CodeStoreUnavailable) ||
		a.code == string(idempotency.CodeLeaseLost) || a.code == string(idempotency.CodeOutcomeUnknown)):
		s.unavailable.Add(1) // a clear problem; the ledger check says whether anything doubled
	default:
		s.violate("%s (X-Outcome %q): unexpected answer %v", key, outcome, a)
	}
}

// TestTxSoak (d): clients send new keys, sequential and concurrent
// duplicates (on routes with and without wait mode), and first attempts
// that answer 502 or panic, whose retries then pay. At the end every key
// has as many payment rows as COMPLETE records (0 or 1), at most one fresh
// answer, and every replay equals it.
func TestTxSoak(t *testing.T) {
	b := newBank(t, bankConfig{pool: func(t *testing.T, url string) *pgxpool.Pool {
		return newPoolOn(t, url, 24)
	}})
	tally := &soakTally{first: map[string]string{}, replayed: map[string][]string{}}
	d := soakDuration(t)
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for w := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for i := 0; time.Now().Before(end); i++ {
				key := fmt.Sprintf("soak-w%d-%d", w, i)
				path := "/pay"
				if rng.IntN(3) == 0 {
					path = "/wait"
				}
				tally.mu.Lock()
				tally.keys = append(tally.keys, key)
				tally.mu.Unlock()
				send := func(outcome string) {
					var a answer
					if outcome == "" {
						a = b.postTo(path, key)
					} else {
						tally.injected.Add(1)
						a = b.postTo(path, key, "X-Outcome", outcome)
					}
					tally.record(key, outcome, a)
				}
				concurrently := func(outcomes ...string) {
					var cw sync.WaitGroup
					for _, o := range outcomes {
						cw.Add(1)
						go func() { defer cw.Done(); send(o) }()
					}
					cw.Wait()
				}
				switch r := rng.IntN(10); {
				case r < 3: // a new key and a duplicate
					send("")
					send("")
				case r < 6: // concurrent duplicates, then one more
					concurrently("", "", "", "")
					send("")
				case r < 7: // a first attempt that fails, its retry, a duplicate
					send("fail")
					send("")
					send("")
				case r < 8: // a first attempt that panics, its retry, a duplicate
					send("panic")
					send("")
					send("")
				default: // a failing, a panicking and two plain attempts at once
					concurrently("fail", "panic", "", "")
					send("")
				}
			}
		}()
	}
	wg.Wait()

	tally.mu.Lock()
	defer tally.mu.Unlock()
	for key, bodies := range tally.replayed {
		for _, body := range bodies {
			if first, ok := tally.first[key]; !ok || body != first {
				tally.violations = append(tally.violations, fmt.Sprintf("replay for %s: %q, fresh answer %q", key, body, first))
			}
		}
	}
	l := b.ledger()
	tally.violations = append(tally.violations, l.check(tally.keys...)...)
	rows, complete := 0, 0
	for _, k := range tally.keys {
		rows += l.rows[k]
		if l.complete[idempotency.StorageKey("", k)] {
			complete++
		}
		if _, ok := tally.first[k]; ok && l.rows[k] != 1 {
			tally.violations = append(tally.violations, fmt.Sprintf("key %s answered 201 but has %d rows", k, l.rows[k]))
		}
	}
	if rows != complete {
		tally.violations = append(tally.violations, fmt.Sprintf("%d payment rows, %d COMPLETE records", rows, complete))
	}
	for _, v := range tally.violations {
		t.Error(v)
	}
	if len(tally.keys) < 50 || tally.replays.Load() == 0 || tally.failed.Load() == 0 || tally.panicked.Load() == 0 {
		t.Errorf("the mix did not happen: %d keys, %d replays, %d 502s, %d panics",
			len(tally.keys), tally.replays.Load(), tally.failed.Load(), tally.panicked.Load())
	}
	note := fmt.Sprintf("%v: %d keys, %d payment rows = %d COMPLETE records; %d fresh, %d replays, %d 409, %d 502, %d panics, %d 503",
		d, len(tally.keys), rows, complete, tally.fresh.Load(), tally.replays.Load(), tally.conflicts.Load(),
		tally.failed.Load(), tally.panicked.Load(), tally.unavailable.Load())
	reliability.Report(t, reliability.Result{Scenario: "soak: transactional routes, duplicates, 5xx and panics", Store: "postgres",
		Operations: tally.requests.Load(), Faults: tally.injected.Load(), Violations: int64(len(tally.violations)), Note: note})
}
