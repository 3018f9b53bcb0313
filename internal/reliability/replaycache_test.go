package reliability_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/replaycache"
)

// countingStore counts the Acquires that reach the store. While hold is
// set, the next Acquire runs it first.
type countingStore struct {
	idempotency.Store
	acquires atomic.Int64
	hold     atomic.Pointer[func()]
}

func (s *countingStore) Acquire(ctx context.Context, req idempotency.AcquireRequest) (idempotency.Acquisition, error) {
	s.acquires.Add(1)
	if hold := s.hold.Swap(nil); hold != nil {
		(*hold)()
	}
	return s.Store.Acquire(ctx, req)
}

// TestReplayCacheStorm: 1,000 duplicates of one completed request arrive
// at once, over HTTP, at an instance with a replay cache; the store holds
// its first Acquire until half of them have arrived (or 5 seconds pass),
// as a slow store would. Each gets the stored response, the handler never
// runs again, and the store sees at most one Acquire: the duplicates that
// arrive during it wait for its answer, the later ones find the record
// kept.
func TestReplayCacheStorm(t *testing.T) {
	const storm = 1000
	store := &countingStore{Store: newMemstore(t)}
	cache := replaycache.New(store)
	ex := newExecutions()
	var arrived atomic.Int64
	mw := idempotency.New(cache)(echoHandler(ex, nil))
	srv, client := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived.Add(1)
		mw.ServeHTTP(w, r)
	}))
	// The record is completed through the store alone, so that the
	// storm finds the cache empty.
	direct, directClient := serve(t, idempotency.New(store)(echoHandler(ex, nil)))
	first := postKey(directClient, direct.URL, "storm", "amount=100")
	if first.status != http.StatusCreated {
		t.Fatalf("first request: %v", first)
	}
	waitUntil(t, 5*time.Second, "the record to be stored", func() bool {
		return postKey(directClient, direct.URL, "storm", "amount=100").replayed
	})
	before := store.acquires.Load()
	hold := func() {
		deadline := time.Now().Add(5 * time.Second)
		for arrived.Load() < storm/2 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
	}
	store.hold.Store(&hold)

	client.Transport.(*http.Transport).MaxIdleConnsPerHost = storm
	start := make(chan struct{})
	var wg sync.WaitGroup
	var violations atomic.Int64
	var mu sync.Mutex
	var wrong []string
	for range storm {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			got := postKey(client, srv.URL, "storm", "amount=100")
			if got.status != http.StatusCreated || !got.replayed || got.body != first.body {
				violations.Add(1)
				mu.Lock()
				if len(wrong) < 5 {
					wrong = append(wrong, got.String())
				}
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	calls := store.acquires.Load() - before
	if calls > 1 {
		violations.Add(1)
	}
	st := cache.Stats()
	reliability.Report(t, reliability.Result{Scenario: "replay cache: a storm of 1,000 duplicates", Store: "memstore",
		Operations: storm, Violations: violations.Load() + int64(ex.of("storm")-1),
		Note: fmt.Sprintf("%d store Acquire(s); %d from the cache, %d shared", calls, st.Hits, st.Shared)})
	if len(wrong) > 0 || ex.of("storm") != 1 {
		t.Fatalf("%d wrong answers (first: %q), %d executions, want every duplicate replayed and 1 execution",
			violations.Load(), wrong, ex.of("storm"))
	}
	if calls > 1 {
		t.Fatalf("the storm cost the store %d Acquires, want at most 1", calls)
	}
}

// TestReplayCacheNeverCrosses: through a replay cache, a duplicate is
// answered with its own record only: the same client key under two scopes,
// two keys under one scope, and each with another body, whether the answer
// comes from the store, from the cache or from another request's store
// call.
func TestReplayCacheNeverCrosses(t *testing.T) {
	t.Run("memstore", func(t *testing.T) { neverCrosses(t, "memstore", newMemstore(t)) })
	t.Run("postgres", func(t *testing.T) { neverCrosses(t, "postgres", newPgStore(t)) })
}

func neverCrosses(t *testing.T, name string, s idempotency.Store) {
	cache := replaycache.New(s)
	ex := newExecutions()
	scope := idempotency.WithKeyScope(func(r *http.Request) string { return r.Header.Get("X-User") })
	srv, client := serve(t, idempotency.New(cache, scope)(echoHandler(ex, nil)))
	type call struct{ user, key, body string }
	calls := []call{
		{"alice", "k1", "card=alice"}, {"bob", "k1", "card=alice"}, {"bob", "k1", "card=bob"},
		{"alice", "k2", "card=alice"}, {"alice", "k2", "card=carol"},
	}
	// The first request of each scope and key runs; its answer is what
	// every duplicate must get, and a request with the same key and
	// scope but another body gets 422.
	owner := map[string]string{} // user/key -> body of the request that ran
	want := map[call]answer{}
	var ops, violations atomic.Int64
	post := func(c call) answer {
		ops.Add(1)
		return postKey(client, srv.URL, c.key, c.body, "X-User", c.user)
	}
	for _, c := range calls {
		id := c.user + "/" + c.key
		if _, ran := owner[id]; ran {
			continue
		}
		a := retryPast409(t, func() answer { return post(c) })
		if a.status != http.StatusCreated || a.replayed {
			t.Fatalf("first %v: %v", c, a)
		}
		owner[id] = c.body
		want[c] = a
	}
	check := func(c call, got answer) {
		id := c.user + "/" + c.key
		if owner[id] != c.body {
			if got.status != http.StatusUnprocessableEntity || got.code != "fingerprint_mismatch" {
				t.Errorf("%v, another body than the record's: %v, want 422", c, got)
				violations.Add(1)
			}
			return
		}
		w := want[c]
		if got.status == http.StatusConflict {
			return // the record is not stored yet
		}
		if got.status != w.status || !got.replayed || got.body != w.body {
			t.Errorf("%v: %v, want a replay of %v", c, got, w)
			violations.Add(1)
		}
	}
	// Rounds of every call at once: the first round fills the cache
	// (sharing store calls), the next ones hit it.
	for range 20 {
		var wg sync.WaitGroup
		for _, c := range calls {
			for range 5 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					check(c, post(c))
				}()
			}
		}
		wg.Wait()
	}
	// A scope that never sent the key runs it afresh.
	if got := post(call{"carol", "k1", "card=alice"}); got.replayed || got.status != http.StatusCreated {
		t.Errorf("carol with alice's key: %v, want a first execution", got)
		violations.Add(1)
	}
	st := cache.Stats()
	reliability.Report(t, reliability.Result{Scenario: "replay cache: replays never cross scopes or keys", Store: name,
		Operations: ops.Load(), Violations: violations.Load(),
		Note: fmt.Sprintf("%d answered from the cache, %d shared, %d store calls", st.Hits, st.Shared, st.Misses)})
	if st.Hits == 0 {
		t.Fatalf("Stats = %+v: no duplicate was answered from the cache", st)
	}
	if n := ex.total(); n != 4 {
		t.Fatalf("%d executions, want 4 (alice/k1, bob/k1, alice/k2, carol/k1)", n)
	}
}
