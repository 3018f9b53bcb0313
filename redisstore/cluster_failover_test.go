package redisstore_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/redisstore"
	"github.com/redis/go-redis/v9"
)

// topologyLongEnv names the environment variable that turns on the long
// topology runs: IDEMPOTENCY_TOPOLOGY_LONG=1.
const topologyLongEnv = "IDEMPOTENCY_TOPOLOGY_LONG"

func topologyLong() bool { return os.Getenv(topologyLongEnv) == "1" }

// trickleResult is one request of a trickle: when it was sent and answered,
// relative to the kill, and its status.
type trickleResult struct {
	sent, answered time.Duration
	status         int
	err            error
}

// TestClusterMasterKilled sends a steady trickle of requests through the
// middleware, each a new key in one slot, kills that slot's master with
// SIGKILL, and measures how long until requests succeed again. The Cluster
// promotes the master's replica after cluster-node-timeout (3s here, about
// 5s in all); the client must then find it, which go-redis does by itself
// only at its periodic reload of the slot map (every 60 seconds by
// default), but the Store has it reload the map when a call fails. With
// the client options of the README (go-redis's defaults otherwise),
// requests succeed again within 5 seconds of the promotion. With
// IDEMPOTENCY_TOPOLOGY_LONG=1 it also measures the options the README
// recommends (ClusterStateReloadInterval and ReadTimeout of 1s).
func TestClusterMasterKilled(t *testing.T) {
	cl := redistest.StartClusterWithReplicas(t, 3)
	configs := []struct {
		name string
		opts redis.ClusterOptions
	}{
		{"default", redis.ClusterOptions{ContextTimeoutEnabled: true}},
	}
	if topologyLong() {
		configs = append(configs, struct {
			name string
			opts redis.ClusterOptions
		}{"recommended", redis.ClusterOptions{ContextTimeoutEnabled: true, ClusterStateReloadInterval: time.Second, ReadTimeout: time.Second}})
	}
	const bound = 5 * time.Second
	for _, c := range configs {
		t.Run(c.name, func(t *testing.T) {
			opts := c.opts
			opts.Addrs = cl.Addrs()
			cc := redis.NewClusterClient(&opts)
			t.Cleanup(func() { cc.Close() })
			promoted, recovered, results := killUnderTrickle(t, cl, cc, promotedBound+bound)
			failed, slowest := 0, time.Duration(0)
			for _, r := range results {
				if r.status != http.StatusCreated {
					failed++
					slowest = max(slowest, r.answered-r.sent)
				}
			}
			t.Logf("%s: replica promoted %v after the kill; requests succeed again %v after it; %d of %d requests failed, the slowest answered in %v",
				c.name, promoted.Round(100*time.Millisecond), recovered.Round(100*time.Millisecond), failed, len(results), slowest.Round(time.Millisecond))
			if recovered > promoted+bound {
				t.Errorf("requests failed until %v after the kill, %v after the promotion; want at most %v", recovered, recovered-promoted, bound)
				return
			}
			reliability.Report(t, reliability.Result{Scenario: "fault: Cluster master killed under a trickle of requests", Store: "redis-cluster",
				Operations: int64(len(results)), Faults: 1,
				Note: "503 until the replica's promotion (about 5s), then served; before, until go-redis's periodic reload (60s)"})
		})
	}
}

// promotedBound bounds the time a Cluster of StartClusterWithReplicas takes
// to promote a replica after its master was killed.
const promotedBound = 30 * time.Second

// killUnderTrickle picks a slot whose master has a replica, sends requests
// with records in that slot one after another, kills the master once some
// succeeded, and returns when 10 requests in a row succeeded after the last
// failure, or limit after the kill. It returns when the Cluster agreed on a
// new master and when requests succeeded again (the answer to the first of
// the successful run), both counted from the kill, and every request's
// result.
func killUnderTrickle(t *testing.T, cl *redistest.Cluster, cc *redis.ClusterClient, limit time.Duration) (promoted, recovered time.Duration, results []trickleResult) {
	var tag string
	var master *redistest.Server
	var slot int
	for i := 0; master == nil; i++ {
		if i == 100 {
			t.Fatal("no master with a replica")
		}
		tag = randKey()[:8]
		slot = cl.KeySlot(t, "{"+tag+"}")
		m := cl.MasterOf(t, slot)
		if r, err := cl.Replicas(m); err == nil && len(r) > 0 {
			master = m
		}
	}
	// The hash tag puts every record of the store in slot.
	s := newStore(t, cc, redisstore.WithPrefix("idemtest:{"+tag+"}:"))
	h := &paymentHandler{}
	srv := httptest.NewServer(idempotency.New(s)(h))
	t.Cleanup(srv.Close)

	var (
		mu     sync.Mutex
		killed time.Time
		done   = make(chan struct{})
		wg     sync.WaitGroup
	)
	since := func(at time.Time) time.Duration {
		mu.Lock()
		defer mu.Unlock()
		if killed.IsZero() {
			return 0
		}
		return at.Sub(killed)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		client := &http.Client{Timeout: 20 * time.Second}
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			sent := time.Now()
			var r trickleResult
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(fmt.Sprint(i)))
			req.Header.Set("Idempotency-Key", fmt.Sprintf("trickle-%d", i))
			resp, err := client.Do(req)
			if err == nil {
				r.status = resp.StatusCode
				resp.Body.Close()
			}
			r.err = err
			r.sent, r.answered = since(sent), since(time.Now())
			mu.Lock()
			results = append(results, r)
			mu.Unlock()
		}
	}()
	stop := sync.OnceFunc(func() {
		close(done)
		wg.Wait()
	})
	t.Cleanup(stop)

	// Some requests succeed before the kill.
	if !redistest.WaitFor(20*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(results) >= 5
	}) {
		t.Fatal("the trickle did not start")
	}
	mu.Lock()
	for _, r := range results {
		if r.status != http.StatusCreated {
			mu.Unlock()
			t.Fatalf("before the kill: %d %v", r.status, r.err)
		}
	}
	results = results[:0]
	killed = time.Now()
	mu.Unlock()
	master.Kill()

	cl.WaitMasterOf(t, slot, master, promotedBound)
	promoted = time.Since(killed)

	// Recovered: 10 successes in a row after the last failure.
	recoveredAt := func() (time.Duration, bool) {
		mu.Lock()
		defer mu.Unlock()
		run := 0
		for i := len(results) - 1; i >= 0 && results[i].status == http.StatusCreated; i-- {
			run++
		}
		if run < 10 {
			return 0, false
		}
		return results[len(results)-run].answered, true
	}
	deadline := time.Now().Add(limit - time.Since(killed))
	for {
		if at, ok := recoveredAt(); ok {
			recovered = at
			break
		}
		if time.Now().After(deadline) {
			recovered = time.Since(killed)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	for _, r := range results {
		if r.status != http.StatusCreated && r.status != http.StatusServiceUnavailable {
			t.Errorf("request sent %v after the kill: %d %v; want 201 or 503", r.sent, r.status, r.err)
		}
	}
	if n := h.calls.Load(); n == 0 {
		t.Error("no request ran its handler")
	}
	return promoted, recovered, results
}
