package reliability_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/redisstore"
)

// TestSentinelFailoverUnderLoad fails the master over while clients send
// new keys and duplicates. Redis replicates asynchronously, so a failover
// can lose a write the old master acknowledged; the store's WAIT (WithWAIT)
// tells which completions reached the replica. The test holds every key to
// exactly one execution unless its record was at risk: its WAIT fell short,
// or its complete failed or was refused. A replay must always carry the
// body of an execution of its own key.
func TestSentinelFailoverUnderLoad(t *testing.T) {
	st := redistest.StartSentinel(t)
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    st.MasterName,
		SentinelAddrs: st.SentinelAddrs(),
		DialTimeout:   200 * time.Millisecond,
		ReadTimeout:   300 * time.Millisecond,
		WriteTimeout:  300 * time.Millisecond,
		PoolTimeout:   300 * time.Millisecond,
		MaxRetries:    2,
	})
	t.Cleanup(func() { c.Close() })

	var atRiskMu sync.Mutex
	atRisk := map[string]bool{} // storage keys whose record may be lost
	markRisk := func(storageKey string) {
		atRiskMu.Lock()
		atRisk[storageKey] = true
		atRiskMu.Unlock()
	}
	prefix := redistest.Prefix()
	store := redisstore.New(c, redisstore.WithPrefix(prefix),
		redisstore.WithWAIT(1, 100*time.Millisecond),
		redisstore.WithWAITErrorHandler(func(_ context.Context, err *redisstore.WAITError) {
			markRisk(err.Key[len(prefix):])
		}))
	t.Cleanup(func() { store.Close() })
	ev := &events{}
	ex := newExecutions()
	mw := idempotency.New(store, idempotency.WithLease(time.Second), idempotency.WithObserver(func(_ context.Context, e idempotency.Event) {
		ev.observe(context.Background(), e)
		if e.Kind == idempotency.EventLeaseLost || (e.Kind == idempotency.EventStoreError && e.Status == 0) {
			markRisk(e.Key) // a complete or release that failed or was refused
		}
	}))
	srv, client := serve(t, mw(echoHandler(ex, nil)))

	var (
		ops, unavailable, conflicts atomic.Int64
		mu                          sync.Mutex
		bodies                      = map[string]map[string]bool{} // key -> bodies of its fresh executions
		replays                     []answer
		replayKeys                  []string
		other                       []string
	)
	stop := make(chan struct{})
	// send retries one request until it gets a final answer.
	send := func(key string) (answer, bool) {
		deadline := time.Now().Add(15 * time.Second)
		for time.Now().Before(deadline) {
			ops.Add(1)
			a := postKey(client, srv.URL, key, "amount=1")
			switch {
			case a.err != nil:
			case a.status == http.StatusServiceUnavailable:
				unavailable.Add(1)
			case a.status == http.StatusConflict:
				conflicts.Add(1)
			default:
				return a, true
			}
			time.Sleep(20 * time.Millisecond)
		}
		return answer{}, false
	}
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("w%d-%d", w, i)
				for j := 0; j < 2; j++ { // the request and one duplicate
					a, ok := send(key)
					mu.Lock()
					switch {
					case !ok:
						other = append(other, key+": no final answer within 15s")
					case a.status == 201 && a.replayed:
						replays, replayKeys = append(replays, a), append(replayKeys, key)
					case a.status == 201:
						if bodies[key] == nil {
							bodies[key] = map[string]bool{}
						}
						bodies[key][a.body] = true
					default:
						other = append(other, key+": "+a.String())
					}
					mu.Unlock()
				}
			}
		}(w)
	}

	time.Sleep(500 * time.Millisecond) // load before the failover
	oldMaster, err := st.MasterAddr()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := redistest.Do(st.Sentinel.Addr(), "SENTINEL", "FAILOVER", st.MasterName); err != nil {
		t.Fatalf("SENTINEL FAILOVER: %v", err)
	}
	waitUntil(t, 20*time.Second, "the sentinel to promote the replica", func() bool {
		addr, err := st.MasterAddr()
		return err == nil && addr != oldMaster
	})
	// Load goes on until the new master has served requests for a while.
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	wg.Wait()

	var violations int64
	atRiskMu.Lock()
	defer atRiskMu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	for _, o := range other {
		t.Errorf("unexpected answer: %s", o)
		violations++
	}
	for key := range bodies {
		if n := ex.of(key); n > 1 && !atRisk[idempotency.StorageKey("", key)] {
			t.Errorf("key %s executed %d times, its completion acknowledged by the replica", key, n)
			violations++
		}
	}
	for i, a := range replays {
		if !bodies[replayKeys[i]][a.body] {
			t.Errorf("replay for %s carries %q, the body of no execution of that key", replayKeys[i], a.body)
			violations++
		}
	}
	reexecuted := 0
	for key := range bodies {
		if ex.of(key) > 1 {
			reexecuted++
		}
	}
	if len(bodies) < 20 || len(replays) < 10 {
		t.Errorf("too little load: %d keys, %d replays", len(bodies), len(replays))
	}
	reliability.Report(t, reliability.Result{
		Scenario: "fault: Sentinel failover under load", Store: "redis-sentinel",
		Operations: ops.Load(), Faults: 1, Violations: violations,
		Note: fmt.Sprintf("%d of %d keys re-executed, each with a completion no replica acknowledged (documented)", reexecuted, len(bodies)),
	})
	t.Logf("%d keys, %d replays, %d 503s, %d 409s during failover; %d keys at risk, %d re-executed",
		len(bodies), len(replays), unavailable.Load(), conflicts.Load(), len(atRisk), reexecuted)
}
