package reliability_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/faultproxy"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/memstore"
)

// owner is one application process in a crash scenario: a middleware over
// its own view of the store, its own server and its own events. Its handler
// blocks, while paused, until woken, and records its context's cause.
type owner struct {
	ev     *events
	url    string
	client *http.Client
	gate   *gate
	cause  atomic.Pointer[error]
}

func newOwner(t *testing.T, store idempotency.Store, lease time.Duration, ex *executions, paused bool) *owner {
	t.Helper()
	o := &owner{ev: &events{}, gate: newGate()}
	h := echoHandler(ex, func(r *http.Request) {
		if !paused {
			return
		}
		// A process that wakes from a pause does not look at its
		// context: it finishes its work and answers as if nothing
		// happened. The context's first cause is recorded for the test.
		ctx := r.Context()
		go func() {
			<-ctx.Done()
			err := context.Cause(ctx)
			o.cause.CompareAndSwap(nil, &err)
		}()
		o.gate.entered <- struct{}{}
		<-o.gate.release
	})
	srv, client := serve(t, idempotency.New(store, idempotency.WithLease(lease), idempotency.WithObserver(o.ev.observe))(h))
	o.url, o.client = srv.URL, client
	return o
}

func (o *owner) post(key string) answer { return postKey(o.client, o.url, key, "charge 5") }

// crashScenario runs the scenario common to both stores: A runs the
// handler and pauses (pause is called once A's handler has started: it stops
// A's heartbeat from reaching the store); B's duplicate waits out the lease,
// steals and completes; A wakes (wake undoes the pause) and finishes; its
// completion must be refused, its context must have been cancelled with
// ErrLeaseLost, and every later duplicate must get B's response.
func crashScenario(t *testing.T, storeName string, a, b *owner, ex *executions, pause, wake func()) {
	t.Helper()
	var ops int64
	aDone := make(chan answer, 1)
	go func() { aDone <- a.post("k") }()
	a.gate.waitEntered(t)
	pause()

	deadline := time.Now().Add(10 * time.Second)
	var bAns answer
	for {
		ops++
		bAns = b.post("k")
		if bAns.status != http.StatusConflict || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if bAns.status != 201 || bAns.replayed {
		t.Fatalf("B after A's lease: %v, want a fresh execution", bAns)
	}
	if ev, ok := b.ev.find(idempotency.EventStolen); !ok || ev.Epoch != 2 {
		t.Fatalf("B did not steal A's lease: %s", b.ev)
	}
	wake()
	// A's heartbeat has given up on the lease, or, back in touch with the
	// store, learns it was stolen: it cancels A's context while A runs.
	waitUntil(t, 5*time.Second, "A's context to be cancelled", func() bool { return a.cause.Load() != nil })
	a.gate.open()
	aAns := <-aDone
	ops++
	if aAns.status != 201 {
		t.Fatalf("A's own answer: %v", aAns)
	}
	if c := a.cause.Load(); c == nil || !errors.Is(*c, idempotency.ErrLeaseLost) {
		t.Fatalf("A's handler context: cause %v, want ErrLeaseLost", c)
	}
	// A's outcome is reported once its refused completion returned.
	waitUntil(t, 5*time.Second, "A's outcome", func() bool { return a.ev.outcomes() == 1 })
	if a.ev.count(idempotency.EventLeaseLost, "") != 1 || a.ev.count(idempotency.EventExecuted, "") != 0 {
		t.Fatalf("A's events %s: want one lease_lost and no executed", a.ev)
	}
	var violations int64
	// B's record is written after B's client has its response.
	waitUntil(t, 5*time.Second, "B's record to be stored", func() bool {
		return b.ev.count(idempotency.EventExecuted, "") == 1
	})
	for _, o := range []*owner{a, b, a, b} {
		ops++
		if d := o.post("k"); !d.replayed || d.body != bAns.body {
			t.Errorf("duplicate got %v, want the replay of B's %q", d, bAns.body)
			violations++
		}
	}
	if ex.of("k") != 2 {
		t.Errorf("%d executions, want A's (refused) and B's", ex.of("k"))
	}
	reliability.Report(t, reliability.Result{Scenario: "crash: paused owner fenced out", Store: storeName,
		Operations: ops, Faults: 1, Violations: violations})
}

func TestCrashPausedOwnerRedis(t *testing.T) {
	const lease = 400 * time.Millisecond
	addr := redistest.Addr(t)
	p, err := faultproxy.New(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	prefix := redistest.Prefix()
	ex := newExecutions()
	// A reaches Redis through its own proxy; B directly. Both use the
	// same prefix: two processes sharing the records.
	storeA := newRedisStoreWithPrefix(t, fastClient(t, p.Addr()), prefix)
	storeB := newRedisStoreWithPrefix(t, fastClient(t, addr), prefix)
	a := newOwner(t, storeA, lease, ex, true)
	b := newOwner(t, storeB, lease, ex, false)
	// The stall holds A's heartbeats: to A it looks like a store that
	// stopped answering, to Redis like a process that died.
	crashScenario(t, "redis", a, b, ex, p.Stall, p.Restore)
}

// pausingStore stands in for a paused process on memstore: while paused,
// its Extend blocks (mode "block") or fails (mode "fail").
type pausingStore struct {
	idempotency.Store
	mode   string
	mu     sync.Mutex
	resume chan struct{} // non-nil while paused
}

var errPaused = errors.New("store unreachable: process paused")

func (s *pausingStore) pause() {
	s.mu.Lock()
	s.resume = make(chan struct{})
	s.mu.Unlock()
}

func (s *pausingStore) wake() {
	s.mu.Lock()
	if s.resume != nil {
		close(s.resume)
		s.resume = nil
	}
	s.mu.Unlock()
}

func (s *pausingStore) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	s.mu.Lock()
	resume := s.resume
	s.mu.Unlock()
	if resume != nil {
		if s.mode == "fail" {
			return errPaused
		}
		<-resume
	}
	return s.Store.Extend(ctx, key, token, lease)
}

func TestCrashPausedOwnerMemstore(t *testing.T) {
	for _, mode := range []string{"block", "fail"} {
		t.Run(mode, func(t *testing.T) {
			const lease = 300 * time.Millisecond
			shared := memstore.New()
			t.Cleanup(func() { shared.Close() })
			ex := newExecutions()
			ps := &pausingStore{Store: shared, mode: mode}
			a := newOwner(t, ps, lease, ex, true)
			b := newOwner(t, shared, lease, ex, false)
			crashScenario(t, "memstore", a, b, ex, ps.pause, ps.wake)
		})
	}
}
