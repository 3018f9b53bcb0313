package reliability_test

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/memstore"
)

// SoakEnv names the environment variable that lengthens each soak run, for
// example IDEMPOTENCY_SOAK=5m. Unset, each store soaks for defaultSoak.
const SoakEnv = "IDEMPOTENCY_SOAK"

const defaultSoak = 3 * time.Second

func soakDuration(t *testing.T) time.Duration {
	t.Helper()
	v := os.Getenv(SoakEnv)
	if v == "" {
		return defaultSoak
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a positive duration such as 5m", SoakEnv, v)
	}
	return d
}

// soakStats is what a soak saw.
type soakStats struct {
	requests, fresh, replays, conflicts, mismatches, full, slow atomic.Int64

	mu         sync.Mutex
	first      map[string]string // key -> body of its first fresh answer
	replayed   [][2]string       // key, body of every replay, checked at the end
	violations []string
}

func (s *soakStats) violate(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.violations) < 50 {
		s.violations = append(s.violations, fmt.Sprintf(format, args...))
	} else {
		s.violations[49] = "... and more"
	}
}

// checkReplays compares every replay with its key's first answer. Callers
// hold mu.
func (s *soakStats) checkReplays() {
	for _, r := range s.replayed {
		if want, ok := s.first[r[0]]; !ok || r[1] != want {
			s.violations = append(s.violations, fmt.Sprintf("wrong replay for %s: %q, first answer %q", r[0], r[1], want))
		}
	}
}

// record checks one answer to a request of key with body and keeps the
// first fresh answer per key.
func (s *soakStats) record(key, body string, a answer, allowFull bool) {
	s.requests.Add(1)
	switch {
	case a.err != nil:
		s.violate("%s: %v", key, a.err)
	case a.status == 201 && a.replayed:
		// A concurrent duplicate's replay can reach its client before the
		// original's answer reaches its own: replays are checked at the end.
		s.replays.Add(1)
		s.mu.Lock()
		s.replayed = append(s.replayed, [2]string{key, a.body})
		s.mu.Unlock()
	case a.status == 201:
		s.fresh.Add(1)
		if !strings.HasPrefix(a.body, "key="+key+" body="+body+" ") {
			s.violate("fresh answer for %s does not echo its request: %q", key, a.body)
		}
		s.mu.Lock()
		if prev, ok := s.first[key]; ok {
			s.violations = append(s.violations, fmt.Sprintf("second fresh answer for %s: %q after %q", key, a.body, prev))
		} else {
			s.first[key] = a.body
		}
		s.mu.Unlock()
	case a.status == 409 && a.code == string(idempotency.CodeInFlight):
		s.conflicts.Add(1)
	case a.status == 422 && a.code == string(idempotency.CodeFingerprintMismatch):
		s.mismatches.Add(1)
	case a.status == 503 && a.code == string(idempotency.CodeStoreFull) && allowFull:
		s.full.Add(1)
	case a.status == 503 && a.code == string(idempotency.CodeStoreUnavailable) && strings.Contains(a.body, "answered too slowly"):
		// The acquire took more than half the lease (the machine stalled:
		// the tests share two cores), so the middleware released the lease
		// unused and ran nothing: a correct answer, counted.
		s.slow.Add(1)
	default:
		s.violate("%s: unexpected answer %v", key, a)
	}
}

// soak drives 32 clients against mw for d: new keys, sequential and
// concurrent duplicates, mismatches, and slow handlers that outlive a third
// of the lease (so heartbeats run), on a route without and one with wait
// mode. It checks that each key ran once, that every replay equals the
// key's first answer and that the middleware answered nothing else (but
// 503 for an acquire slower than half the lease, which runs nothing).
func soak(t *testing.T, storeName string, store idempotency.Store, d time.Duration, allowFull bool) *soakStats {
	t.Helper()
	const lease = time.Second
	ex := newExecutions()
	handler := echoHandler(ex, func(r *http.Request) {
		if strings.HasPrefix(r.Header.Get(idempotency.HeaderKey), "slow-") {
			time.Sleep(lease/3 + 100*time.Millisecond) // the work itself
		}
	})
	mux := http.NewServeMux()
	mux.Handle("POST /pay", idempotency.New(store, idempotency.WithLease(lease))(handler))
	mux.Handle("POST /wait", idempotency.New(store, idempotency.WithLease(lease), idempotency.WithWait(5*time.Second))(handler))
	srv, client := serve(t, mux)

	st := &soakStats{first: map[string]string{}}
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for i := 0; time.Now().Before(end); i++ {
				route := "/pay"
				if rng.IntN(2) == 0 {
					route = "/wait"
				}
				url := srv.URL + route
				key := fmt.Sprintf("%s-w%d-%d", route[1:], w, i)
				if rng.IntN(20) == 0 {
					key = "slow-" + key
				}
				body := fmt.Sprintf("amount=%d", rng.IntN(1000))
				send := func(b string) { st.record(key, b, postKey(client, url, key, b), allowFull) }
				switch r := rng.IntN(10); {
				case r < 4: // a new key and a duplicate after it
					send(body)
					send(body)
				case r < 7: // concurrent duplicates
					var cw sync.WaitGroup
					for j := 0; j < 4; j++ {
						cw.Add(1)
						go func() { defer cw.Done(); send(body) }()
					}
					cw.Wait()
					send(body)
				case r < 9: // a mismatch after the original
					send(body)
					send(body + "-changed")
				default: // a new key only
					send(body)
				}
			}
		}(w)
	}
	wg.Wait()

	st.mu.Lock()
	defer st.mu.Unlock()
	st.checkReplays()
	for _, v := range st.violations {
		t.Error(v)
	}
	distinct := int64(len(st.first))
	if ex.total() != distinct {
		st.violations = append(st.violations, "executions != keys")
		t.Errorf("%d handler executions for %d distinct accepted keys", ex.total(), distinct)
	}
	if st.replays.Load() == 0 || st.mismatches.Load() == 0 || distinct < 100 {
		t.Errorf("the mix did not happen: %d keys, %d replays, %d mismatches", distinct, st.replays.Load(), st.mismatches.Load())
	}
	reliability.Report(t, reliability.Result{Scenario: "soak: 32 clients, mixed traffic", Store: storeName,
		Operations: st.requests.Load(), Violations: int64(len(st.violations))})
	t.Logf("%v: %d requests, %d keys, %d replays, %d 409s, %d 422s, %d store_full, %d slow acquires (503)",
		d, st.requests.Load(), distinct, st.replays.Load(), st.conflicts.Load(), st.mismatches.Load(), st.full.Load(), st.slow.Load())
	return st
}

func TestSoakMemstore(t *testing.T) {
	s := memstore.New()
	t.Cleanup(func() { s.Close() })
	soak(t, "memstore", s, soakDuration(t), false)
}

func TestSoakRedis(t *testing.T) {
	soak(t, "redis", newRedisStore(t, fastClient(t, redistest.Addr(t))), soakDuration(t), false)
}

// TestSoakMemstoreBounded churns keys through a small memstore with a short
// TTL: the entry count never exceeds the cap, a full store answers
// store_full (never evicting a live record), and the heap after a GC stays
// bounded.
func TestSoakMemstoreBounded(t *testing.T) {
	const maxEntries = 256
	const heapBound = 32 << 20 // bytes of live heap after a GC
	s := memstore.New(memstore.WithMaxEntries(maxEntries), memstore.WithSweepInterval(50*time.Millisecond))
	t.Cleanup(func() { s.Close() })
	ex := newExecutions()
	srv, client := serve(t, idempotency.New(s, idempotency.WithTTL(500*time.Millisecond))(echoHandler(ex, nil)))

	var maxSeen atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			if n := int64(s.Len()); n > maxSeen.Load() {
				maxSeen.Store(n)
			}
		}
	}()
	st := &soakStats{first: map[string]string{}}
	end := time.Now().Add(soakDuration(t))
	var wg sync.WaitGroup
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; time.Now().Before(end); i++ {
				key := fmt.Sprintf("churn-w%d-%d", w, i)
				a := postKey(client, srv.URL, key, "x")
				st.record(key, "x", a, true)
				if a.status == 201 { // an immediate duplicate, well within the TTL
					st.record(key, "x", postKey(client, srv.URL, key, "x"), true)
				}
			}
		}(w)
	}
	wg.Wait()
	close(stop)
	<-sampled

	var violations int64
	st.mu.Lock()
	st.checkReplays()
	for _, v := range st.violations {
		t.Error(v)
		violations++
	}
	st.mu.Unlock()
	if maxSeen.Load() > maxEntries {
		t.Errorf("the store held %d entries, over its cap of %d", maxSeen.Load(), maxEntries)
		violations++
	}
	if ex.total() != int64(len(st.first)) {
		t.Errorf("%d executions for %d accepted keys", ex.total(), len(st.first))
		violations++
	}
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	if m.HeapAlloc > heapBound {
		t.Errorf("heap after GC: %d MiB, bound %d MiB", m.HeapAlloc>>20, heapBound>>20)
		violations++
	}
	if len(st.first) <= maxEntries {
		t.Errorf("only %d keys: the churn never pushed past the cap", len(st.first))
	}
	reliability.Report(t, reliability.Result{Scenario: "soak: bounded memstore under churn", Store: "memstore",
		Operations: st.requests.Load(), Violations: violations,
		Note: fmt.Sprintf("cap %d entries, max seen %d; heap after GC %d MiB (bound %d MiB)", maxEntries, maxSeen.Load(), m.HeapAlloc>>20, heapBound>>20)})
	t.Logf("%d requests, %d keys, %d store_full, max entries %d", st.requests.Load(), len(st.first), st.full.Load(), maxSeen.Load())
}
