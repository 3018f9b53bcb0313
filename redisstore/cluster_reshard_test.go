package redisstore_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/redisstore"
	"github.com/redis/go-redis/v9"
)

// TestClusterReshardUnderLoad moves one slot back and forth between two
// masters, pausing between the steps of each move so that requests meet
// it migrating (ASK) and moved (MOVED), while workers send requests whose
// records all live in that slot (the store's prefix has a hash tag), with
// WithWAIT. Each handler runs up to 100ms, so many are in flight when a
// step comes. Every key must run its handler exactly once, and every
// duplicate must replay its first answer (after 409s while the original
// runs). It runs 3 moves; IDEMPOTENCY_TOPOLOGY_LONG=1 runs them for a
// minute.
func TestClusterReshardUnderLoad(t *testing.T) {
	cl := redistest.StartClusterWithReplicas(t, 3)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { cc.Close() })

	tag := randKey()[:8]
	slot := cl.KeySlot(t, "{"+tag+"}")
	var shortfalls atomic.Int64
	s := newStore(t, cc, redisstore.WithPrefix("idemtest:{"+tag+"}:"), redisstore.WithWAIT(1, time.Second),
		redisstore.WithWAITErrorHandler(func(_ context.Context, err *redisstore.WAITError) { shortfalls.Add(1) }))

	var (
		mu   sync.Mutex
		runs = map[string]int{} // Idempotency-Key -> handler runs
	)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		runs[key]++
		n := runs[key]
		mu.Unlock()
		time.Sleep(time.Duration(rand.IntN(100)) * time.Millisecond)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "%s run %d", key, n)
	})
	// A short lease: a record left IN_PROGRESS by a failed complete is
	// stolen, and its handler run again, within the test.
	srv := httptest.NewServer(idempotency.New(s, idempotency.WithLease(2*time.Second))(handler))
	t.Cleanup(srv.Close)

	var (
		stop                      = make(chan struct{})
		wg                        sync.WaitGroup
		keys, conflicts, failures atomic.Int64
		errMu                     sync.Mutex
		firstErrs                 []string
	)
	fail := func(format string, args ...any) {
		failures.Add(1)
		errMu.Lock()
		if len(firstErrs) < 10 {
			firstErrs = append(firstErrs, fmt.Sprintf(format, args...))
		}
		errMu.Unlock()
	}
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("reshard-%d-%d", w, n)
				first := postAsync(srv.URL+"/payments", key, "{}")
				if first.err != nil || first.status != http.StatusCreated {
					fail("%s: first: %d %s %v", key, first.status, first.body, first.err)
					continue
				}
				keys.Add(1)
				// The duplicate gets 409 until the record is COMPLETE
				// (the response goes out before the complete), then the
				// replay.
				deadline := time.Now().Add(10 * time.Second)
				for {
					dup := postAsync(srv.URL+"/payments", key, "{}")
					if dup.err == nil && dup.status == http.StatusConflict && time.Now().Before(deadline) {
						conflicts.Add(1)
						time.Sleep(20 * time.Millisecond)
						continue
					}
					if dup.err != nil || dup.status != http.StatusCreated || dup.replayed != "true" || !bytes.Equal(dup.body, first.body) {
						fail("%s: duplicate: %d replayed=%q %s %v; want the replay of %s", key, dup.status, dup.replayed, dup.body, dup.err, first.body)
					}
					break
				}
			}
		}(w)
	}

	stopWorkers := sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
	})
	t.Cleanup(stopWorkers) // before srv.Close, should a move fail the test

	moves, long := 3, topologyLong()
	end := time.Now().Add(time.Minute)
	pause := func() { time.Sleep(time.Duration(50+rand.IntN(100)) * time.Millisecond) }
	from := cl.MasterOf(t, slot)
	to := cl.OtherMaster(t, from)
	done := 0
	for ; long && time.Now().Before(end) || !long && done < moves; done++ {
		pause()
		cl.BeginSlotMigration(t, slot, from, to)
		pause()
		cl.MigrateSlotKeys(t, slot, from, to)
		pause()
		cl.FinishSlotMigration(t, slot, to)
		from, to = to, from
	}
	pause()
	stopWorkers()

	mu.Lock()
	twice := 0
	for key, n := range runs {
		if n != 1 {
			twice++
			if twice <= 10 {
				t.Errorf("%s: handler ran %d times", key, n)
			}
		}
	}
	mu.Unlock()
	t.Logf("%d moves of slot %d; %d keys, %d ran more than once; %d 409s before replays; %d WAIT shortfalls; %d errors",
		done, slot, keys.Load(), twice, conflicts.Load(), shortfalls.Load(), failures.Load())
	for _, e := range firstErrs {
		t.Error(e)
	}
	if keys.Load() < int64(done) {
		t.Errorf("only %d keys completed during %d moves", keys.Load(), done)
	}
	if !t.Failed() {
		reliability.Report(t, reliability.Result{Scenario: "fault: Cluster slot moved back and forth under load", Store: "redis-cluster",
			Operations: 2 * keys.Load(), Faults: int64(done),
			Note: "WithWAIT, every record in the moving slot: each key ran once, every duplicate replayed"})
	}
}
