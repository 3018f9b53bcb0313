package reliability_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/faultproxy"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/memstore"
)

// faultRig is a middleware over Redis reached through a fault proxy.
type faultRig struct {
	proxy  *faultproxy.Proxy
	ev     *events
	ex     *executions
	url    string
	client *http.Client
	ops    atomic.Int64 // HTTP requests sent
}

func newFaultRig(t *testing.T, lease time.Duration, before func(r *http.Request)) *faultRig {
	t.Helper()
	p, err := faultproxy.New(redistest.Addr(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	rig := &faultRig{proxy: p, ev: &events{}, ex: newExecutions()}
	store := newRedisStore(t, fastClient(t, p.Addr()))
	mw := idempotency.New(store, idempotency.WithLease(lease), idempotency.WithObserver(rig.ev.observe))
	srv, client := serve(t, mw(echoHandler(rig.ex, before)))
	rig.url, rig.client = srv.URL+"/pay", client
	rig.warmUp(t)
	return rig
}

// warmUp loads the scripts into Redis's cache, so that a pattern trigger
// meets the command that runs (EVALSHA) and not one answered NOSCRIPT.
func (rig *faultRig) warmUp(t *testing.T) {
	t.Helper()
	if a := postKey(rig.client, rig.url, "warm-up", ""); a.status != 201 {
		t.Fatalf("warm-up request: %v", a)
	}
}

func (rig *faultRig) post(key, body string) answer {
	rig.ops.Add(1)
	return postKey(rig.client, rig.url, key, body)
}

// retryPast409 sends the request until it is not answered 409.
func (rig *faultRig) retryPast409(t *testing.T, key, body string) answer {
	t.Helper()
	return retryPast409(t, func() answer { return rig.post(key, body) })
}

// fingerprint is the fingerprint the middleware sends with default options
// for a POST /pay with body, as the acquire script receives it: learnt from
// such a request through the middleware, since it covers the route too.
func fingerprint(body string) []byte {
	store := &fingerprintStore{Store: memstore.New()}
	defer store.Store.(*memstore.Store).Close()
	h := idempotency.New(store)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(body))
	r.Header.Set(idempotency.HeaderKey, "probe")
	h.ServeHTTP(httptest.NewRecorder(), r)
	return []byte(store.fingerprint)
}

// fingerprintStore keeps the fingerprint of the last Acquire.
type fingerprintStore struct {
	idempotency.Store
	fingerprint string
}

func (s *fingerprintStore) Acquire(ctx context.Context, req idempotency.AcquireRequest) (idempotency.Acquisition, error) {
	s.fingerprint = req.Fingerprint
	return s.Store.Acquire(ctx, req)
}

func TestFaultCutDuringAcquire(t *testing.T) {
	t.Run("request lost", func(t *testing.T) {
		rig := newFaultRig(t, 300*time.Millisecond, nil)
		rig.proxy.Cut()
		a := rig.post("k1", "pay 10")
		if a.status != http.StatusServiceUnavailable || a.code != string(idempotency.CodeStoreUnavailable) {
			t.Fatalf("with Redis cut: %v, want 503 store_unavailable", a)
		}
		if rig.ex.of("k1") != 0 {
			t.Fatal("the handler ran without a lease")
		}
		rig.proxy.Restore()
		first := rig.post("k1", "pay 10")
		again := rig.post("k1", "pay 10")
		if first.status != 201 || first.replayed || !again.replayed || again.body != first.body || rig.ex.of("k1") != 1 {
			t.Fatalf("after restore: %v then %v, %d executions", first, again, rig.ex.of("k1"))
		}
		reliability.Report(t, reliability.Result{Scenario: "fault: cut during acquire", Store: "redis",
			Operations: rig.ops.Load(), Faults: rig.proxy.Faults()})
	})

	t.Run("reply lost", func(t *testing.T) {
		// The acquire lands and takes a lease, the reply is lost: the
		// client gets 503 and its retry meets a record held by a token
		// nobody has; it gets 409 until that lease ends, then steals.
		lease := 300 * time.Millisecond
		rig := newFaultRig(t, lease, nil)
		fired := rig.proxy.CutOn(fingerprint("pay 20"), faultproxy.CutAfterReply)
		a := rig.post("k2", "pay 20")
		<-fired
		if a.status != http.StatusServiceUnavailable || rig.ex.of("k2") != 0 {
			t.Fatalf("acquire reply lost: %v, %d executions; want 503 and none", a, rig.ex.of("k2"))
		}
		rig.proxy.Restore()
		start := time.Now()
		b := rig.retryPast409(t, "k2", "pay 20")
		if b.status != 201 || b.replayed || rig.ex.of("k2") != 1 {
			t.Fatalf("retry: %v, %d executions; want one execution", b, rig.ex.of("k2"))
		}
		if ev, ok := rig.ev.find(idempotency.EventStolen); !ok || ev.Epoch != 2 {
			t.Fatalf("no steal of the orphaned lease: %s", rig.ev)
		}
		if waited := time.Since(start); waited > lease+2*time.Second {
			t.Fatalf("the retry waited %v for a lease of %v", waited, lease)
		}
		if c := rig.post("k2", "pay 20"); !c.replayed || c.body != b.body {
			t.Fatalf("duplicate: %v, want the replay of %q", c, b.body)
		}
		reliability.Report(t, reliability.Result{Scenario: "fault: cut during acquire", Store: "redis",
			Operations: rig.ops.Load(), Faults: rig.proxy.Faults(), Note: "acquire reply lost: retry steals after the lease"})
	})
}

func TestFaultCutDuringComplete(t *testing.T) {
	const lease = 400 * time.Millisecond
	// The complete script carries the response body; the marker in the
	// request body is echoed into it and appears in no other command.
	t.Run("reply lost, restored during the retries", func(t *testing.T) {
		rig := newFaultRig(t, lease, nil)
		fired := rig.proxy.CutOn([]byte("marker-a"), faultproxy.CutAfterReply)
		go func() { <-fired; rig.proxy.Restore() }()
		first := rig.post("k", "marker-a")
		if first.status != 201 || rig.ex.of("k") != 1 {
			t.Fatalf("first: %v", first)
		}
		dup := rig.retryPast409(t, "k", "marker-a") // the record is written after the response
		if !dup.replayed || dup.body != first.body || rig.ex.of("k") != 1 {
			t.Fatalf("duplicate: %v (%d executions), want the replay of %q", dup, rig.ex.of("k"), first.body)
		}
		note := "retried complete answered ok"
		if rig.ev.count(idempotency.EventStoreError, "complete") > 0 {
			note = "complete retries exhausted before restore; record landed"
		}
		reliability.Report(t, reliability.Result{Scenario: "fault: cut during complete", Store: "redis",
			Operations: rig.ops.Load(), Faults: rig.proxy.Faults(), Note: note})
	})

	t.Run("landed, store unreachable through the retries", func(t *testing.T) {
		rig := newFaultRig(t, lease, nil)
		fired := rig.proxy.CutOn([]byte("marker-b"), faultproxy.CutAfterReply)
		first := rig.post("k", "marker-b")
		<-fired
		if first.status != 201 || rig.ex.of("k") != 1 {
			t.Fatalf("first: %v", first)
		}
		// The client has its response before the record is written; the
		// failure is reported once the retries are spent.
		waitUntil(t, 5*time.Second, "the failed complete to be reported", func() bool {
			return rig.ev.count(idempotency.EventStoreError, "complete") == 1
		})
		rig.proxy.Restore()
		dup := rig.post("k", "marker-b")
		if !dup.replayed || dup.body != first.body || rig.ex.of("k") != 1 {
			t.Fatalf("duplicate: %v (%d executions), want the replay of %q", dup, rig.ex.of("k"), first.body)
		}
		reliability.Report(t, reliability.Result{Scenario: "fault: cut during complete", Store: "redis",
			Operations: rig.ops.Load(), Faults: rig.proxy.Faults(), Note: "complete landed, reply lost: duplicate replays"})
	})

	t.Run("never landed", func(t *testing.T) {
		// The outcome-unknown case that costs a second execution: the
		// complete never reached Redis and every retry failed. The record
		// stays IN_PROGRESS; a duplicate gets 409 until the lease ends,
		// then steals and runs the handler again. At most one execution
		// per lease window, and the first response, never stored, is
		// never replayed.
		rig := newFaultRig(t, lease, nil)
		fired := rig.proxy.CutOn([]byte("marker-c"), faultproxy.CutBefore)
		first := rig.post("k", "marker-c")
		<-fired
		if first.status != 201 || rig.ex.of("k") != 1 {
			t.Fatalf("first: %v, events %s", first, rig.ev)
		}
		waitUntil(t, 5*time.Second, "the failed complete to be reported", func() bool {
			return rig.ev.count(idempotency.EventStoreError, "complete") == 1
		})
		rig.proxy.Restore()
		second := rig.retryPast409(t, "k", "marker-c")
		if second.status != 201 || second.replayed || rig.ex.of("k") != 2 {
			t.Fatalf("after the lease: %v, %d executions; want a second execution", second, rig.ex.of("k"))
		}
		if ev, ok := rig.ev.find(idempotency.EventStolen); !ok || ev.Epoch != 2 {
			t.Fatalf("the second execution did not steal the first lease: %s", rig.ev)
		}
		if starts := rig.ex.startTimes("k"); starts[1].Sub(starts[0]) < lease-10*time.Millisecond {
			t.Fatalf("second execution %v after the first: inside its lease window of %v", starts[1].Sub(starts[0]), lease)
		}
		third := rig.post("k", "marker-c")
		if !third.replayed || third.body != second.body {
			t.Fatalf("replay %v, want the stored second response %q", third, second.body)
		}
		reliability.Report(t, reliability.Result{Scenario: "fault: cut during complete", Store: "redis",
			Operations: rig.ops.Load(), Faults: rig.proxy.Faults(),
			Note: "complete never landed: duplicate steals after the lease and runs again (documented)"})
	})
}

func TestFaultCutDuringHeartbeat(t *testing.T) {
	t.Run("shorter than the lease", func(t *testing.T) {
		// Long enough that a loaded machine's late beat or slow redial
		// after the restore still lands inside the lease.
		const lease = 3 * time.Second
		g := newGate()
		var cause atomic.Pointer[error]
		rig := newFaultRig(t, lease, func(r *http.Request) {
			if err := g.wait(r.Context()); err != nil {
				cause.Store(&err)
			}
		})
		done := make(chan answer, 1)
		go func() { done <- rig.post("k", "long job") }()
		g.waitEntered(t)
		// Beats come every lease/3. The cut spans more than one beat, so
		// at least one fails; from the last good beat before it to the
		// first after it is at most lease/2 + lease/3, inside the lease.
		time.Sleep(lease / 3)
		rig.proxy.Cut()
		time.Sleep(lease / 2)
		rig.proxy.Restore()
		time.Sleep(lease / 2) // a beat after the restore extends the lease again
		g.open()
		first := <-done
		if first.status != 201 || cause.Load() != nil {
			t.Fatalf("handler outlived a short cut: %v, cancelled: %v", first, cause.Load())
		}
		if rig.ev.count(idempotency.EventStoreError, "extend") != 1 || rig.ev.count(idempotency.EventLeaseLost, "") != 0 {
			t.Fatalf("events %s; want the failed extend reported and no lease lost", rig.ev)
		}
		dup := rig.post("k", "long job")
		if !dup.replayed || dup.body != first.body || rig.ex.of("k") != 1 {
			t.Fatalf("duplicate %v, %d executions", dup, rig.ex.of("k"))
		}
		reliability.Report(t, reliability.Result{Scenario: "fault: cut during heartbeat", Store: "redis",
			Operations: rig.ops.Load(), Faults: rig.proxy.Faults(), Note: "cut < lease: lease kept"})
	})

	t.Run("longer than the lease", func(t *testing.T) {
		const lease = 300 * time.Millisecond
		g := newGate()
		var committed atomic.Int64
		causes := make(chan error, 4)
		rig := newFaultRig(t, lease, nil)
		// This handler stops when its context ends and answers 503, which
		// releases the key: an aborted execution has no effect.
		srvHandler := func(w http.ResponseWriter, r *http.Request) {
			key := r.Header.Get(idempotency.HeaderKey)
			id := rig.ex.start(key)
			if err := g.wait(r.Context()); err != nil {
				causes <- err
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			committed.Add(1)
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte(echo(key, "", id)))
		}
		store := newRedisStore(t, fastClient(t, rig.proxy.Addr()))
		srv, client := serve(t, idempotency.New(store, idempotency.WithLease(lease), idempotency.WithObserver(rig.ev.observe))(http.HandlerFunc(srvHandler)))
		rig.url, rig.client = srv.URL, client
		g.open()
		rig.warmUp(t)
		g, committed = newGate(), atomic.Int64{}

		done := make(chan answer, 1)
		go func() { done <- rig.post("k", "") }()
		g.waitEntered(t)
		rig.proxy.Cut()
		var cause error
		select {
		case cause = <-causes:
		case <-time.After(5 * lease):
			t.Fatal("the handler's context was not cancelled while the heartbeat failed past the lease")
		}
		if !errors.Is(cause, idempotency.ErrLeaseLost) {
			t.Fatalf("context cause %v, want ErrLeaseLost", cause)
		}
		first := <-done
		// The loss is reported with the outcome, once the client has its answer.
		waitUntil(t, 5*time.Second, "the lost lease to be reported", func() bool { return rig.ev.count(idempotency.EventLeaseLost, "") >= 1 })
		if first.status != http.StatusServiceUnavailable || rig.ev.count(idempotency.EventLeaseLost, "") != 1 {
			t.Fatalf("aborted execution: %v, events %s", first, rig.ev)
		}
		rig.proxy.Restore()
		g.open()
		retry := rig.retryPast409(t, "k", "")
		dup := rig.post("k", "")
		if retry.status != 201 || !dup.replayed || dup.body != retry.body || committed.Load() != 1 {
			t.Fatalf("retry %v, duplicate %v, %d committed executions; want exactly one", retry, dup, committed.Load())
		}
		reliability.Report(t, reliability.Result{Scenario: "fault: cut during heartbeat", Store: "redis",
			Operations: rig.ops.Load(), Faults: rig.proxy.Faults(),
			Note: "cut > lease: handler cancelled with ErrLeaseLost"})
	})
}

// TestRedisRestart restarts the server under the middleware: without
// persistence the restart loses records (documented); with appendfsync
// always nothing is lost and exactly-once holds across it.
func TestRedisRestart(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		durable bool
	}{
		{"no persistence", nil, false},
		{"appendfsync always", []string{"--appendonly", "yes", "--appendfsync", "always"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const lease = 900 * time.Millisecond
			srv := redistest.Start(t, tc.args...)
			ev, ex := &events{}, newExecutions()
			g := newGate()
			var cause atomic.Pointer[error]
			store := newRedisStore(t, fastClient(t, srv.Addr()))
			mw := idempotency.New(store, idempotency.WithLease(lease), idempotency.WithObserver(ev.observe))
			hs, client := serve(t, mw(echoHandler(ex, func(r *http.Request) {
				if strings.Contains(r.Header.Get(idempotency.HeaderKey), "slow") {
					if err := g.wait(r.Context()); err != nil {
						cause.Store(&err)
					}
				}
			})))
			var ops int64
			post := func(key string) answer { ops++; return postKey(client, hs.URL, key, "b") }

			done := post("done")
			inflight := make(chan answer, 1)
			go func() { inflight <- postKey(client, hs.URL, "slow", "b") }()
			g.waitEntered(t)
			srv.Restart()

			if tc.durable {
				// The in-flight record survived; its heartbeat carries on.
				time.Sleep(lease / 2)
				g.open()
				slow := <-inflight
				if slow.status != 201 || cause.Load() != nil {
					t.Fatalf("in-flight request across a durable restart: %v, cancelled %v", slow, cause.Load())
				}
				a, b := post("done"), post("slow")
				if !a.replayed || a.body != done.body || !b.replayed || b.body != slow.body || ex.total() != 2 {
					t.Fatalf("after restart: %v, %v; %d executions", a, b, ex.total())
				}
				reliability.Report(t, reliability.Result{Scenario: "fault: Redis restart", Store: "redis",
					Operations: ops + 1, Faults: 1, Note: "appendfsync always: nothing lost"})
				return
			}
			// The record is gone: the heartbeat finds the lease lost and
			// cancels the handler; a handler that ignores it and returns
			// is refused at complete.
			waitUntil(t, 5*time.Second, "the lease lost on the emptied server", func() bool { return cause.Load() != nil })
			if !errors.Is(*cause.Load(), idempotency.ErrLeaseLost) {
				t.Fatalf("cause %v, want ErrLeaseLost", *cause.Load())
			}
			slow := <-inflight
			waitUntil(t, 5*time.Second, "the refused completion to be reported", func() bool { return ev.count(idempotency.EventLeaseLost, "") >= 1 })
			if slow.status != 201 || ev.count(idempotency.EventLeaseLost, "") != 1 || ev.count(idempotency.EventExecuted, "") != 1 {
				t.Fatalf("in-flight: %v, events %s", slow, ev)
			}
			// New keys work at once (scripts reloaded after NOSCRIPT).
			n1 := post("new")
			n2 := post("new")
			if n1.status != 201 || !n2.replayed || n2.body != n1.body {
				t.Fatalf("new key after restart: %v, %v", n1, n2)
			}
			// The lost COMPLETE record: its duplicate runs again.
			again := post("done")
			if again.status != 201 || again.replayed || ex.of("done") != 2 {
				t.Fatalf("duplicate of a record lost in the restart: %v", again)
			}
			reliability.Report(t, reliability.Result{Scenario: "fault: Redis restart", Store: "redis",
				Operations: ops + 1, Faults: 1,
				Note: "no persistence: records lost, in-flight lease lost and its complete refused (documented)"})
		})
	}
}
