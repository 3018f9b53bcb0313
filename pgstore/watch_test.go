package pgstore_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/pgstore"
)

func closedWithin(ch <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}

// listeners counts the connections of the database that LISTEN (their last
// statement was a LISTEN).
func listeners(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND query LIKE 'LISTEN %'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func watch(t *testing.T, s *pgstore.Store, key string) (<-chan struct{}, func()) {
	t.Helper()
	ch, stop, err := s.Watch(ctx, key)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	return ch, stop
}

// TestWatchSharesOneConnection: the waiters of a Store share one listening
// connection, and each is woken by its own record's completion.
func TestWatchSharesOneConnection(t *testing.T) {
	pool := newPool(t, func(c *pgxpool.Config) { c.MaxConns = 8 })
	s := newStore(t, pool)
	const waiters = 30
	keys := make([]string, waiters)
	chans := make([]<-chan struct{}, waiters)
	var wg sync.WaitGroup
	for i := range keys {
		keys[i] = randKey()
		mustAcquire(t, s, req(keys[i], "owner"), idempotency.Acquired)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ch, stop, err := s.Watch(ctx, keys[i])
			if err != nil {
				t.Errorf("Watch: %v", err)
				return
			}
			t.Cleanup(stop)
			chans[i] = ch
		}()
	}
	wg.Wait()
	if n := listeners(t, pool); n != 1 || s.ListenerConnects() != 1 {
		t.Fatalf("%d listening connections (%d opened), want 1", n, s.ListenerConnects())
	}
	for i, key := range keys {
		if i%2 == 0 {
			if err := s.Complete(ctx, key, "owner", sampleResponse(), time.Hour); err != nil {
				t.Fatal(err)
			}
		} else if err := s.Release(ctx, key, "owner"); err != nil {
			t.Fatal(err)
		}
		if !closedWithin(chans[i], 3*time.Second) {
			t.Fatalf("waiter %d not woken", i)
		}
	}
}

// TestWatchNotifiesOnlyWatchedRecords: complete and release send a
// notification only for a record a waiter marked, with the key as payload.
func TestWatchNotifiesOnlyWatchedRecords(t *testing.T) {
	pool := newPool(t)
	s := newStore(t, pool)
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `LISTEN idempotency_records`); err != nil {
		t.Fatal(err)
	}
	next := func(d time.Duration) string {
		ctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return ""
		}
		return n.Payload
	}

	quiet, watched := randKey(), randKey()
	mustAcquire(t, s, req(quiet, "o"), idempotency.Acquired)
	mustAcquire(t, s, req(watched, "o"), idempotency.Acquired)
	if err := s.Complete(ctx, quiet, "o", sampleResponse(), time.Hour); err != nil {
		t.Fatal(err)
	}
	if p := next(150 * time.Millisecond); p != "" {
		t.Fatalf("a record nobody watched notified %q", p)
	}
	_, stop := watch(t, s, watched)
	defer stop()
	if err := s.Release(ctx, watched, "o"); err != nil {
		t.Fatal(err)
	}
	if p := next(3 * time.Second); p != watched {
		t.Fatalf("notification %q, want the watched key", p)
	}
}

// TestWatchListenerKilled: when the server ends the listening connection
// (pg_terminate_backend), every waiter is woken, and the Store listens
// again on a new connection for the next waiters.
func TestWatchListenerKilled(t *testing.T) {
	pool := newPool(t)
	s := newStore(t, pool)
	key := randKey()
	mustAcquire(t, s, req(key, "o"), idempotency.Acquired)
	ch, stop := watch(t, s, key)
	defer stop()
	start := time.Now()
	pgtest.Terminate(t, pool, s.ListenerPID())
	woken := closedWithin(ch, 3*time.Second)
	took := time.Since(start)
	if !woken {
		t.Fatal("the waiter was not woken when its connection died")
	}
	waitFor(t, 5*time.Second, "a new listening connection", func() bool { return s.ListenerConnects() == 2 })

	key2 := randKey()
	mustAcquire(t, s, req(key2, "o"), idempotency.Acquired)
	ch2, stop2 := watch(t, s, key2)
	defer stop2()
	if err := s.Complete(ctx, key2, "o", sampleResponse(), time.Hour); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(ch2, 3*time.Second) {
		t.Fatal("the new connection did not wake a waiter")
	}
	reliability.Report(t, reliability.Result{Scenario: "fault: listening connection killed", Store: "postgres",
		Operations: 6, Faults: 1,
		Note: "waiter woken in " + took.Round(time.Millisecond).String() + "; a new connection listens"})
}

// TestWatchFrozenListener: a listening connection whose server stops
// answering (no reset) is found dead by the health check, its waiters are
// woken, a Watch meanwhile returns by its deadline, and the Store listens
// again once the server answers.
func TestWatchFrozenListener(t *testing.T) {
	pool := newPool(t)
	proxy, through := pgtest.Proxy(t, pool.Config().ConnConfig)
	const health = 150 * time.Millisecond
	s := newStore(t, pool, pgstore.WithListenerConfig(through), pgstore.WithListenerHealthCheck(health))
	key := randKey()
	mustAcquire(t, s, req(key, "o"), idempotency.Acquired)
	ch, stop := watch(t, s, key)
	defer stop()

	proxy.Stall()
	stalled := time.Now()
	if !closedWithin(ch, 10*health) {
		t.Fatalf("the waiter was not woken within %v of the server freezing", 10*health)
	}
	woken := time.Since(stalled)
	if woken < health {
		t.Errorf("woken after %v, before a health check could fail", woken)
	}

	// While nothing answers, Watch returns by its deadline.
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	began := time.Now()
	_, _, err := s.Watch(wctx, key)
	cancel()
	if err == nil || time.Since(began) > time.Second {
		t.Fatalf("Watch with a 200ms deadline on a frozen server: %v after %v", err, time.Since(began))
	}

	proxy.Restore()
	var ch2 <-chan struct{}
	waitFor(t, 10*time.Second, "a Watch to succeed after the server came back", func() bool {
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		c, stop, err := s.Watch(wctx, key)
		if err != nil {
			return false
		}
		t.Cleanup(stop)
		ch2 = c
		return true
	})
	if err := s.Complete(ctx, key, "o", sampleResponse(), time.Hour); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(ch2, 3*time.Second) {
		t.Fatal("the new connection did not wake the waiter")
	}
	reliability.Report(t, reliability.Result{Scenario: "fault: listening connection frozen", Store: "postgres",
		Operations: 4, Faults: 1,
		Note: "health check " + health.String() + ": waiter woken after " + woken.Round(time.Millisecond).String() +
			"; Watch bounded by its deadline meanwhile"})
}

// TestWatchNoServer: with no server to listen on, Watch returns by its
// context's deadline, or after twice the health-check interval without one.
func TestWatchNoServer(t *testing.T) {
	pool := newPool(t)
	nowhere := pool.Config().ConnConfig.Copy()
	nowhere.Host, nowhere.Port, nowhere.Fallbacks = "127.0.0.1", 1, nil
	const health = 100 * time.Millisecond
	s := newStore(t, pool, pgstore.WithListenerConfig(nowhere), pgstore.WithListenerHealthCheck(health))

	wctx, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, _, err := s.Watch(wctx, randKey()); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Watch with a deadline: %v", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Watch with a 150ms deadline took %v", took)
	}
	start = time.Now()
	if _, _, err := s.Watch(ctx, randKey()); err == nil {
		t.Error("Watch without a deadline succeeded with no server")
	}
	if took := time.Since(start); took < 2*health || took > 2*health+time.Second {
		t.Errorf("Watch without a deadline took %v, want about %v", took, 2*health)
	}
}

// TestCloseWakesWaiters: Close wakes the waiters and ends a Watch still
// waiting for a connection with ErrStoreClosed.
func TestCloseWakesWaiters(t *testing.T) {
	pool := newPool(t)
	s := pgstore.New(pool)
	key := randKey()
	mustAcquire(t, s, req(key, "o"), idempotency.Acquired)
	ch, stop := watch(t, s, key)
	defer stop()

	nowhere := pool.Config().ConnConfig.Copy()
	nowhere.Host, nowhere.Port, nowhere.Fallbacks = "127.0.0.1", 1, nil
	pending := pgstore.New(pool, pgstore.WithListenerConfig(nowhere))
	errc := make(chan error, 1)
	go func() {
		_, _, err := pending.Watch(ctx, key)
		errc <- err
	}()

	s.Close()
	if !closedWithin(ch, 3*time.Second) {
		t.Fatal("Close did not wake the waiter")
	}
	time.Sleep(20 * time.Millisecond) // let the pending Watch start waiting; either way it must end
	pending.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, idempotency.ErrStoreClosed) {
			t.Fatalf("pending Watch: %v, want ErrStoreClosed", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Close did not end the pending Watch")
	}
}
