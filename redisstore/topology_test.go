package redisstore_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/redisstore"
	"github.com/redis/go-redis/v9"
)

// exerciseStore runs every edge once on fresh keys and checks the answers.
func exerciseStore(t *testing.T, s *redisstore.Store) {
	t.Helper()
	key := randKey()
	mustAcquire(t, s, req(key, "t1"), idempotency.Acquired)
	mustAcquire(t, s, req(key, "t2"), idempotency.InFlight)
	if err := s.Extend(ctx, key, "t1", 10*time.Second); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	changed, stop, err := s.Watch(ctx, key)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer stop()
	if err := s.Complete(ctx, key, "t1", sampleResponse(), time.Hour); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	waitClosed(t, changed, "complete")
	got := mustAcquire(t, s, req(key, "t3"), idempotency.Completed)
	if got.Response.Status != 201 || string(got.Response.Body) != string(sampleResponse().Body) {
		t.Fatalf("replay %+v", got.Response)
	}
	key2 := randKey()
	mustAcquire(t, s, req(key2, "t1"), idempotency.Acquired)
	if err := s.Release(ctx, key2, "t1"); err != nil {
		t.Fatalf("Release: %v", err)
	}
	mustAcquire(t, s, req(key2, "t2"), idempotency.Acquired)
}

// TestRestartReloadsScripts: a restarted server has lost its script cache;
// EVALSHA answers NOSCRIPT and the store falls back to EVAL, for every
// script, and keeps working. Waiters resubscribe on the new connection.
func TestRestartReloadsScripts(t *testing.T) {
	srv := redistest.Start(t)
	c := hookedClient(t, srv.Addr())
	counter := &commandCounter{}
	c.AddHook(counter)
	s := newStore(t, c)
	exerciseStore(t, s)
	counter.reset()
	exerciseStore(t, s)
	for _, name := range counter.sent() {
		if name != "evalsha" {
			t.Fatalf("warm store sent %v, want only evalsha", counter.sent())
		}
	}

	srv.Restart()
	// The first call after the restart may hit the dropped connection;
	// go-redis retries it on a new one. Each script then meets NOSCRIPT
	// once and is sent with EVAL, which caches it again.
	counter.reset()
	exerciseStore(t, s)
	exerciseStore(t, s)
	evals := 0
	for _, name := range counter.sent() {
		if name == "eval" {
			evals++
		}
	}
	if evals != 5 {
		t.Fatalf("after restart sent %v: want one EVAL per script (5)", counter.sent())
	}

	// Waiters survive a restart: a waiter registered after it is woken.
	srv.Restart()
	key := randKey()
	if !redistest.WaitFor(5*time.Second, func() bool {
		_, err := s.Acquire(ctx, req(key, "t1"))
		return err == nil
	}) {
		t.Fatal("store unusable after restart")
	}
	var ch <-chan struct{}
	var stop func()
	if !redistest.WaitFor(5*time.Second, func() bool {
		var err error
		ch, stop, err = s.Watch(ctx, key)
		return err == nil
	}) {
		t.Fatal("Watch unusable after restart")
	}
	defer stop()
	if err := s.Release(ctx, key, "t1"); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, ch, "release after restart")
}

// TestRestartWakesWaiters: waiters registered before the connection
// breaks are woken, so they re-check instead of sleeping out their bound.
func TestRestartWakesWaiters(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, clientFor(t, srv.Addr()))
	ch, stop, err := s.Watch(ctx, randKey())
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	srv.Restart()
	waitClosed(t, ch, "connection loss")
}

func TestWAITWithReplica(t *testing.T) {
	master := redistest.Start(t)
	replica := redistest.StartReplica(t, master)
	c := hookedClient(t, master.Addr())
	var mu sync.Mutex
	var reports []*redisstore.WAITError
	onWAIT := redisstore.WithWAITErrorHandler(func(_ context.Context, err *redisstore.WAITError) {
		mu.Lock()
		reports = append(reports, err)
		mu.Unlock()
	})
	counter := &commandCounter{}
	c.AddHook(counter)

	// One replica asked, one present: the record is on the replica when
	// Complete returns.
	s := newStore(t, c, redisstore.WithWAIT(1, 2*time.Second), onWAIT)
	rc := clientFor(t, replica.Addr())
	for i := 0; i < 3; i++ { // the first round also loads the script
		key := randKey()
		mustAcquire(t, s, req(key, "t1"), idempotency.Acquired)
		counter.reset()
		if err := s.Complete(ctx, key, "t1", sampleResponse(), time.Hour); err != nil {
			t.Fatal(err)
		}
		if i > 0 && (counter.roundTrips.Load() != 1 || counter.commands.Load() != 2) {
			t.Errorf("Complete with WAIT: %d round trips, %d commands; want 1 and 2",
				counter.roundTrips.Load(), counter.commands.Load())
		}
		if st := recordState(rc, s.RecordKey(key)); st != "complete" {
			t.Fatalf("replica state right after Complete = %q, want complete", st)
		}
	}
	mu.Lock()
	if len(reports) != 0 {
		t.Fatalf("unexpected WAIT reports: %v", reports)
	}
	mu.Unlock()

	// Two replicas asked, one present: Complete still succeeds, the
	// shortfall is reported.
	s2 := newStore(t, c, redisstore.WithWAIT(2, 50*time.Millisecond), onWAIT)
	key := randKey()
	mustAcquire(t, s2, req(key, "t1"), idempotency.Acquired)
	if err := s2.Complete(ctx, key, "t1", sampleResponse(), time.Hour); err != nil {
		t.Fatalf("Complete with a WAIT shortfall = %v, want nil", err)
	}
	mustAcquire(t, s2, req(key, "t2"), idempotency.Completed)
	mu.Lock()
	defer mu.Unlock()
	if len(reports) != 1 || reports[0].Replicas != 2 || reports[0].Acked != 1 || reports[0].Key != s2.RecordKey(key) {
		t.Fatalf("WAIT reports %v, want one shortfall 1 of 2", reports)
	}
}

func TestCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { cc.Close() })
	s := newStore(t, cc)

	// Keys spread over the masters, and every edge works on each.
	masters := map[string]int{}
	for i := 0; i < 24; i++ {
		exerciseStore(t, s)
		key := randKey()
		m, err := cc.MasterForKey(ctx, s.RecordKey(key))
		if err != nil {
			t.Fatal(err)
		}
		masters[m.Options().Addr]++
		mustAcquire(t, s, req(key, "t"), idempotency.Acquired)
		if n := m.Exists(ctx, s.RecordKey(key)).Val(); n != 1 {
			t.Fatalf("record not on its slot's master %s", m.Options().Addr)
		}
	}
	if len(masters) < 2 {
		t.Fatalf("keys landed on %d master(s), want more than 1: %v", len(masters), masters)
	}

	// WAIT on a cluster goes to the key's master (no replicas: a
	// shortfall, reported, Complete succeeds).
	var shortfalls int
	var mu sync.Mutex
	sw := newStore(t, cc, redisstore.WithWAIT(1, 20*time.Millisecond),
		redisstore.WithWAITErrorHandler(func(_ context.Context, err *redisstore.WAITError) {
			mu.Lock()
			shortfalls++
			mu.Unlock()
		}))
	for i := 0; i < 6; i++ {
		key := randKey()
		mustAcquire(t, sw, req(key, "t"), idempotency.Acquired)
		if err := sw.Complete(ctx, key, "t", sampleResponse(), time.Hour); err != nil {
			t.Fatalf("Complete with WAIT on a cluster: %v", err)
		}
		mustAcquire(t, sw, req(key, "t2"), idempotency.Completed)
	}
	mu.Lock()
	if shortfalls != 6 {
		t.Errorf("%d shortfalls reported, want 6", shortfalls)
	}
	mu.Unlock()

	// Many waiters on keys of every slot owner, one pub/sub connection.
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			key := randKey()
			tok := "w" + strconv.Itoa(i)
			if _, err := s.Acquire(ctx, req(key, tok)); err != nil {
				t.Error(err)
				return
			}
			ch, stop, err := s.Watch(ctx, key)
			if err != nil {
				t.Error(err)
				return
			}
			defer stop()
			if err := s.Release(ctx, key, tok); err != nil {
				t.Error(err)
				return
			}
			select {
			case <-ch:
			case <-time.After(5 * time.Second):
				t.Errorf("waiter %d not woken on the cluster", i)
			}
		}(i)
	}
	wg.Wait()
}

func TestSentinelFailover(t *testing.T) {
	st := redistest.StartSentinel(t)
	fc := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    st.MasterName,
		SentinelAddrs: st.SentinelAddrs(),
	})
	t.Cleanup(func() { fc.Close() })
	s := newStore(t, fc)
	exerciseStore(t, s)

	// A record completed (and replicated, via WAIT) before the failover
	// survives it.
	sw := newStore(t, fc, redisstore.WithWAIT(1, 2*time.Second))
	kept := randKey()
	mustAcquire(t, sw, req(kept, "t1"), idempotency.Acquired)
	if err := sw.Complete(ctx, kept, "t1", sampleResponse(), time.Hour); err != nil {
		t.Fatal(err)
	}

	old, err := st.MasterAddr()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := redistest.Do(st.Sentinel.Addr(), "SENTINEL", "FAILOVER", st.MasterName); err != nil {
		t.Fatalf("SENTINEL FAILOVER: %v", err)
	}
	if !redistest.WaitFor(20*time.Second, func() bool {
		addr, err := st.MasterAddr()
		if err != nil || addr == old {
			return false
		}
		info, err := redistest.Do(addr, "INFO", "replication")
		return err == nil && redistest.InfoField(info, "role") == "master"
	}) {
		t.Fatal("no new master after SENTINEL FAILOVER")
	}

	// The store keeps working once the client follows the new master
	// (the old master may refuse writes as a replica for a moment).
	var lastErr error
	if !redistest.WaitFor(20*time.Second, func() bool {
		key := randKey()
		_, lastErr = s.Acquire(ctx, req(key, "probe"))
		return lastErr == nil
	}) {
		t.Fatalf("store unusable after failover: %v", lastErr)
	}
	exerciseStore(t, s)
	got := mustAcquire(t, sw, req(kept, "t2"), idempotency.Completed)
	if got.Response.Status != 201 {
		t.Fatalf("replay after failover: %+v", got.Response)
	}
	if err := s.Release(ctx, randKey(), "nobody"); err != nil && !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatal(err)
	}
}
