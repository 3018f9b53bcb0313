package reliability_test

import (
	"crypto/sha1"
	"encoding/hex"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/faultproxy"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/internal/reliability"
)

// The stall scenarios hold Redis's replies with the connection open, as a
// frozen server or a congested network does, at a chosen moment: while an
// acquire, a heartbeat or a complete is out. Each runs two application
// instances sharing one Redis: A reaches it through the fault proxy, B
// directly, and both use go-redis with its default settings (3s read
// timeout, 3 retries), so the client library's own retries are part of the
// fault.

// instance is one application process: a middleware over its own Redis
// client, its own server and its own events.
type instance struct {
	ev     *events
	url    string
	client *http.Client
}

func newInstance(t *testing.T, addr, prefix string, lease time.Duration, h http.Handler) *instance {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr}) // go-redis defaults: timeouts and retries
	t.Cleanup(func() { c.Close() })
	in := &instance{ev: &events{}}
	store := newRedisStoreWithPrefix(t, c, prefix)
	srv, client := serve(t, idempotency.New(store, idempotency.WithLease(lease), idempotency.WithObserver(in.ev.observe))(h))
	in.url, in.client = srv.URL+"/pay", client
	return in
}

func (in *instance) post(key, body string) answer { return postKey(in.client, in.url, key, body) }

// retryPast409 sends the request until it is not answered 409.
func (in *instance) retryPast409(t *testing.T, key, body string) answer {
	t.Helper()
	return retryPast409(t, func() answer { return in.post(key, body) })
}

// charges is a handler's record of its side effects: an execution charges
// only if its context is still live when its work is done. It also notes
// when each execution started and when a context was cancelled, to show that
// no handler worked on after another could have taken its record over.
type charges struct {
	mu        sync.Mutex
	done      map[string]int
	started   map[string][]time.Time
	cancelled map[string][]time.Time
}

func newCharges() *charges {
	return &charges{done: map[string]int{}, started: map[string][]time.Time{}, cancelled: map[string][]time.Time{}}
}

func (c *charges) start(key string) {
	c.mu.Lock()
	c.started[key] = append(c.started[key], time.Now())
	c.mu.Unlock()
}

func (c *charges) charge(key string) {
	c.mu.Lock()
	c.done[key]++
	c.mu.Unlock()
}

func (c *charges) cancel(key string) {
	c.mu.Lock()
	c.cancelled[key] = append(c.cancelled[key], time.Now())
	c.mu.Unlock()
}

func (c *charges) of(key string) (done int, started, cancelled []time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.done[key], append([]time.Time(nil), c.started[key]...), append([]time.Time(nil), c.cancelled[key]...)
}

// chargeHandler charges once its work is done (when hold returns, or at
// once without hold), unless its context ended first: then it answers 503,
// which releases the key.
func chargeHandler(c *charges, hold func(r *http.Request) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(idempotency.HeaderKey)
		c.start(key)
		if hold != nil && !hold(r) {
			c.cancel(key)
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		c.charge(key)
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte("charged " + key + " by " + r.Host))
	})
}

// scriptSHA is the SHA-1 go-redis sends in EVALSHA for a script of
// redisstore.
func scriptSHA(t *testing.T, name string) []byte {
	t.Helper()
	src, err := os.ReadFile("../../redisstore/" + name)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha1.Sum(src)
	return []byte(hex.EncodeToString(sum[:]))
}

// stallRig is a Redis, a fault proxy in front of it, and the two instances.
type stallRig struct {
	addr  string
	proxy *faultproxy.Proxy
	a, b  *instance
}

func newStallRig(t *testing.T, lease time.Duration, h http.Handler) *stallRig {
	t.Helper()
	addr := redistest.Start(t).Addr()
	p, err := faultproxy.New(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	prefix := redistest.Prefix()
	rig := &stallRig{addr: addr, proxy: p,
		a: newInstance(t, p.Addr(), prefix, lease, h),
		b: newInstance(t, addr, prefix, lease, h)}
	// Load the scripts, so that a pattern meets the EVALSHA that runs.
	for _, in := range []*instance{rig.a, rig.b} {
		if w := in.post("warm-up-"+in.url, "w"); w.status != http.StatusCreated {
			t.Fatalf("warm-up: %v", w)
		}
	}
	return rig
}

// TestStallDuringAcquire: A's acquire takes the lease, then Redis holds its
// reply past go-redis's read timeout and past the lease. go-redis sends the
// script again; that retry, with A's token, must renew the lease (not answer
// "acquired" on a lease that ran out), so B's duplicate right after it is
// refused; and A, whose acquire took longer than half the lease, must not
// run the handler on what is left. One execution in all.
func TestStallDuringAcquire(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second
	c := newCharges()
	rig := newStallRig(t, lease, chargeHandler(c, nil))
	fp := fingerprint("pay 10")
	sent, _ := rig.proxy.StallOn(fp, faultproxy.StallAfter, 7*time.Second)
	aDone := make(chan answer, 1)
	start := time.Now()
	go func() { aDone <- rig.a.post("k", "pay 10") }()
	<-sent
	calls := redistest.CommandCalls(t, rig.addr, "evalsha")
	// The first attempt ran; go-redis gives up on its reply after its read
	// timeout (5s) and sends the script again, on a new connection whose
	// reply is held too.
	retried, _ := rig.proxy.StallOn(fp, faultproxy.StallAfter, time.Second)
	select {
	case <-retried:
	case <-time.After(15 * time.Second):
		t.Fatal("go-redis did not retry the stalled acquire")
	}
	waitUntil(t, 5*time.Second, "the retried acquire to run", func() bool { return redistest.CommandCalls(t, rig.addr, "evalsha") > calls })
	if since := time.Since(start); since < lease {
		t.Fatalf("the retry came %v after the first attempt, inside the lease of %v: the scenario needs it later", since, lease)
	}
	dup := rig.b.post("k", "pay 10")
	if dup.status != http.StatusConflict {
		t.Fatalf("B's duplicate after A's retried acquire: %v, want 409 (the retry renewed A's lease)", dup)
	}
	a := <-aDone
	if a.status != http.StatusServiceUnavailable || a.code != string(idempotency.CodeStoreUnavailable) {
		t.Fatalf("A after a %v acquire: %v, want 503 store_unavailable", time.Since(start).Round(time.Millisecond), a)
	}
	if done, _, _ := c.of("k"); done != 0 {
		t.Fatal("A ran the handler on an acquire that took longer than half the lease")
	}
	b := rig.b.retryPast409(t, "k", "pay 10")
	again := rig.a.retryPast409(t, "k", "pay 10")
	done, started, _ := c.of("k")
	if b.status != http.StatusCreated || !again.replayed || again.body != b.body || done != 1 || len(started) != 1 {
		t.Fatalf("B's retry %v, A's duplicate %v, %d charges in %d executions; want one", b, again, done, len(started))
	}
	reliability.Report(t, reliability.Result{Scenario: "stall: during acquire, longer than the lease", Store: "redis",
		Operations: 4, Faults: rig.proxy.Faults(),
		Note: "go-redis retry renewed the lease; acquire slower than lease/2 released unused (503); 1 execution"})
}

// TestStallDuringHeartbeat: A's heartbeat reaches Redis, which holds the
// reply for longer than the lease. A's extend is bounded by what is left of
// the lease and its context is cancelled before the lease can run out in
// Redis; only then can B take the record over. A stops at the cancellation
// and charges nothing; B charges once.
func TestStallDuringHeartbeat(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	c := newCharges()
	release := make(chan struct{})
	var held atomic.Bool
	hold := func(r *http.Request) bool {
		if strings.HasPrefix(r.Header.Get(idempotency.HeaderKey), "warm-up") || held.Swap(true) {
			return true // only A's execution is long
		}
		select {
		case <-release:
			return true
		case <-r.Context().Done():
			return false
		}
	}
	rig := newStallRig(t, lease, chargeHandler(c, hold))
	stalled, _ := rig.proxy.StallOn(scriptSHA(t, "extend.lua"), faultproxy.StallAfter, 5*lease/2)
	aDone := make(chan answer, 1)
	go func() { aDone <- rig.a.post("k", "long job") }()
	select {
	case <-stalled:
	case <-time.After(5 * time.Second):
		t.Fatal("no heartbeat")
	}
	b := rig.b.retryPast409(t, "k", "long job")
	close(release)
	a := <-aDone
	done, started, cancelled := c.of("k")
	if b.status != http.StatusCreated || a.status != http.StatusServiceUnavailable {
		t.Fatalf("A got %v, B got %v; want A cancelled (503 from its handler), B run", a, b)
	}
	if len(started) != 2 || len(cancelled) != 1 || !cancelled[0].Before(started[1]) {
		t.Fatalf("executions started %v, cancelled %v: A's context must end before B starts", started, cancelled)
	}
	if done != 1 {
		t.Fatalf("%d charges, want 1", done)
	}
	if dup := rig.a.retryPast409(t, "k", "long job"); !dup.replayed || dup.body != b.body {
		t.Fatalf("duplicate %v, want B's response", dup)
	}
	waitUntil(t, 5*time.Second, "A's lost lease to be reported", func() bool { return rig.a.ev.count(idempotency.EventLeaseLost, "") >= 1 })
	if rig.a.ev.count(idempotency.EventLeaseLost, "") != 1 {
		t.Fatalf("A's events %s: want the lost lease reported", rig.a.ev)
	}
	reliability.Report(t, reliability.Result{Scenario: "stall: during heartbeat, longer than the lease", Store: "redis",
		Operations: 3, Faults: rig.proxy.Faults(),
		Note: "extend bounded by the lease; A cancelled " + started[1].Sub(cancelled[0]).Round(time.Millisecond).String() + " before B started; 1 charge"})
}

// TestStallDuringComplete: Redis holds the reply of A's complete (it
// landed), or the complete itself (it lands after the lease). A's client has
// its response before either; A's store calls end within the lease, not
// after go-redis's retries. When the complete landed, B replays it; when it
// was held past the lease, B runs the handler again (the documented cost of
// a complete that did not land in time) and A's late complete is refused.
func TestStallDuringComplete(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	for _, tc := range []struct {
		name string
		mode faultproxy.StallMode
	}{{"reply held", faultproxy.StallAfter}, {"request held", faultproxy.StallBefore}} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCharges()
			rig := newStallRig(t, lease, chargeHandler(c, nil))
			marker := []byte("charged k by " + strings.TrimSuffix(strings.TrimPrefix(rig.a.url, "http://"), "/pay"))
			stalled, ended := rig.proxy.StallOn(marker, tc.mode, 3*time.Second)
			start := time.Now()
			a := rig.a.post("k", "pay")
			answered := time.Since(start)
			select {
			case <-ended:
				t.Fatalf("A's client waited %v, until the stall ended", answered)
			default:
			}
			select {
			case <-stalled: // the complete goes out after the response
			case <-time.After(5 * time.Second):
				t.Fatal("the complete was not stalled")
			}
			if a.status != http.StatusCreated {
				t.Fatalf("A: %v", a)
			}
			waitUntil(t, 5*time.Second, "A's complete to give up", func() bool {
				return rig.a.ev.count(idempotency.EventStoreError, "complete") == 1
			})
			if gaveUp := time.Since(start); gaveUp > lease+time.Second {
				t.Fatalf("A's complete gave up after %v, want within the lease (%v)", gaveUp, lease)
			}
			b := rig.b.retryPast409(t, "k", "pay")
			done, started, _ := c.of("k")
			if tc.mode == faultproxy.StallAfter {
				if !b.replayed || b.body != a.body || done != 1 {
					t.Fatalf("B got %v after A's complete landed, %d charges; want A's replay", b, done)
				}
			} else {
				if b.status != http.StatusCreated || b.replayed || done != 2 || started[1].Sub(start) < lease {
					// The lease runs from A's acquire on Redis's clock, which is
					// after start but may be before A's handler noted started[0].
					t.Fatalf("B got %v, executions at %v (A sent at %v): want a second execution after A's lease", b, started, start)
				}
				calls := redistest.CommandCalls(t, rig.addr, "evalsha")
				<-ended // A's held complete reaches Redis now, and is refused
				waitUntil(t, 5*time.Second, "A's held complete to run", func() bool { return redistest.CommandCalls(t, rig.addr, "evalsha") > calls })
				if d := rig.a.retryPast409(t, "k", "pay"); !d.replayed || d.body != b.body {
					t.Fatalf("duplicate after A's late complete: %v, want B's response", d)
				}
			}
			note := "reply held: client answered in " + answered.Round(time.Millisecond).String() + ", complete landed, replayed"
			if tc.mode == faultproxy.StallBefore {
				note = "request held past the lease: second execution after the lease (documented), A's late complete refused"
			}
			reliability.Report(t, reliability.Result{Scenario: "stall: during complete", Store: "redis",
				Operations: 3, Faults: rig.proxy.Faults(), Note: note})
		})
	}
}
