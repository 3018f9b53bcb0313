//go:build unix

package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/redisstore"
	"github.com/redis/go-redis/v9"
)

// The tests in this file freeze Redis nodes with SIGSTOP: a frozen node
// keeps its connections open and answers nothing, so only timeouts tell
// the store that something is wrong.

// frozenReadTimeout is the ReadTimeout of the clients of the tests that
// need the store to notice a frozen node: its pub/sub connection counts as
// dead when a reply is this late, and is pinged after half of it.
const frozenReadTimeout = 500 * time.Millisecond

// clientName returns a client name unique to the call, to find a client's
// connections in CLIENT LIST.
func clientName() string {
	return strings.TrimSuffix(strings.ReplaceAll(redistest.Prefix(), ":", "-"), "-")
}

// subscribedConns counts the connections of the server at addr named name
// that hold a channel subscription.
func subscribedConns(t *testing.T, addr, name string) int {
	t.Helper()
	list, err := redistest.Do(addr, "CLIENT", "LIST")
	if err != nil {
		t.Fatalf("CLIENT LIST on %s: %v", addr, err)
	}
	n := 0
	for _, line := range strings.Split(list, "\n") {
		fields := strings.Fields(line)
		if !slices.Contains(fields, "name="+name) {
			continue
		}
		for _, f := range fields {
			if v, ok := strings.CutPrefix(f, "sub="); ok && v != "0" {
				n++
			}
		}
	}
	return n
}

// TestFrozenWatchReturnsByDeadline: with the server frozen, Watch returns
// by its context's deadline whether the channel is already subscribed (it
// goes on to mark the record), new, or the first of a store (its pub/sub
// connection must be opened). The client has go-redis's defaults: it does
// not stop calls at their deadline and waits 5s for a reply.
func TestFrozenWatchReturnsByDeadline(t *testing.T) {
	srv := redistest.Start(t)
	c := clientFor(t, srv.Addr())
	s := newStore(t, c)
	fresh := newStore(t, c)
	held := randKey()
	mustAcquire(t, s, req(held, "t1"), idempotency.Acquired)
	_, stop, err := s.Watch(ctx, held)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	srv.Freeze(t)
	const deadline = 300 * time.Millisecond
	for _, tc := range []struct {
		name  string
		store *redisstore.Store
		key   string
	}{
		{"subscribed channel", s, held},
		{"new channel", s, randKey()},
		{"first Watch of a store", fresh, randKey()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wctx, cancel := context.WithTimeout(ctx, deadline)
			defer cancel()
			start := time.Now()
			_, stop, err := tc.store.Watch(wctx, tc.key)
			took := time.Since(start)
			if err == nil {
				stop()
				t.Fatal("Watch succeeded on a frozen server")
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Watch = %v, want the context's deadline", err)
			}
			if took > deadline+time.Second {
				t.Errorf("Watch returned after %v; its deadline was %v", took, deadline)
			}
		})
	}
}

// TestFrozenConnectionWakesWaiters: when the node holding the store's
// pub/sub connection freezes, the store notices within one and a half
// reply timeouts (a PING after half of one, then a whole one for its
// reply), wakes its waiters and drops the connection, and a Watch without
// a deadline gives up; once the node is back, a new waiter is notified on a
// new connection and the dropped one is gone.
func TestFrozenConnectionWakesWaiters(t *testing.T) {
	srv := redistest.Start(t)
	name := clientName()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: frozenReadTimeout, ClientName: name})
	t.Cleanup(func() { c.Close() })
	s := newStore(t, c)
	key := randKey()
	mustAcquire(t, s, req(key, "t1"), idempotency.Acquired)
	ch, stop, err := s.Watch(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	srv.Freeze(t)
	frozen := time.Now()
	bound := 3*frozenReadTimeout/2 + time.Second
	select {
	case <-ch:
		t.Logf("waiter woken %v after the freeze", time.Since(frozen).Round(time.Millisecond))
	case <-time.After(bound):
		t.Fatalf("waiter not woken within %v of the freeze", bound)
	}

	// Without a deadline, a Watch gives up on its subscription after
	// twice the reply timeout.
	start := time.Now()
	if _, _, err := s.Watch(context.Background(), randKey()); err == nil {
		t.Error("Watch without a deadline succeeded on a frozen server")
	}
	if took := time.Since(start); took > 2*frozenReadTimeout+time.Second {
		t.Errorf("Watch without a deadline returned after %v", took)
	}
	srv.Thaw()

	key2 := randKey()
	mustAcquire(t, s, req(key2, "t1"), idempotency.Acquired)
	ch2, stop2, err := s.Watch(ctx, key2)
	if err != nil {
		t.Fatalf("Watch after the node came back: %v", err)
	}
	defer stop2()
	if err := s.Release(ctx, key2, "t1"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch2:
	case <-time.After(2 * time.Second):
		t.Fatal("waiter not notified after the node came back")
	}
	if !redistest.WaitFor(5*time.Second, func() bool { return subscribedConns(t, srv.Addr(), name) == 1 }) {
		t.Fatalf("%d subscribed connections, want 1 (the dropped one closed)", subscribedConns(t, srv.Addr(), name))
	}
}

// gatedHandler answers 201 with a body naming the request's key and the
// call; a request waits in it until the gate of its key is opened.
type gatedHandler struct {
	calls   atomic.Int64
	entered chan string // the key of each request entering the handler

	mu    sync.Mutex
	gates map[string]chan struct{}
}

func newGatedHandler() *gatedHandler {
	return &gatedHandler{entered: make(chan string, 16), gates: make(map[string]chan struct{})}
}

func (h *gatedHandler) gate(key string) chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	g := h.gates[key]
	if g == nil {
		g = make(chan struct{})
		h.gates[key] = g
	}
	return g
}

func (h *gatedHandler) open(key string) {
	g := h.gate(key)
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-g:
	default:
		close(g)
	}
}

func (h *gatedHandler) openAll() {
	h.mu.Lock()
	var keys []string
	for k := range h.gates {
		keys = append(keys, k)
	}
	h.mu.Unlock()
	for _, k := range keys {
		h.open(k)
	}
}

func (h *gatedHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(idempotency.HeaderKey)
	n := h.calls.Add(1)
	select {
	case h.entered <- key:
	default:
	}
	<-h.gate(key)
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "%s #%d", key, n)
}

// awaitEntered waits until a request for key entered h.
func (h *gatedHandler) awaitEntered(t *testing.T, key string) {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case k := <-h.entered:
			if k == key {
				return
			}
		case <-timeout:
			t.Fatalf("no request for %s entered the handler", key)
		}
	}
}

// observedStore reports, on waiting, the storage key of each wait-mode
// duplicate that watched the record and then found it still in flight:
// from then on only a notification, a re-check on the store's own account,
// the holder's lease or the wait bound ends its wait.
type observedStore struct {
	*redisstore.Store
	waiting chan string

	mu      sync.Mutex
	watched map[string]bool
}

func observe(s *redisstore.Store) *observedStore {
	return &observedStore{Store: s, waiting: make(chan string, 64), watched: make(map[string]bool)}
}

func (o *observedStore) Watch(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	ch, stop, err := o.Store.Watch(ctx, key)
	if err == nil {
		o.mu.Lock()
		o.watched[key] = true
		o.mu.Unlock()
	}
	return ch, stop, err
}

func (o *observedStore) Acquire(ctx context.Context, r idempotency.AcquireRequest) (idempotency.Acquisition, error) {
	a, err := o.Store.Acquire(ctx, r)
	if err == nil && a.Outcome == idempotency.InFlight {
		o.mu.Lock()
		watched := o.watched[r.Key]
		delete(o.watched, r.Key)
		o.mu.Unlock()
		if watched {
			select {
			case o.waiting <- r.Key:
			default:
			}
		}
	}
	return a, err
}

// awaitWaiting waits until a duplicate for the header key waits on a
// watched record.
func (o *observedStore) awaitWaiting(t *testing.T, key string) {
	t.Helper()
	sk := idempotency.StorageKey("", key)
	timeout := time.After(5 * time.Second)
	for {
		select {
		case k := <-o.waiting:
			if k == sk {
				return
			}
		case <-timeout:
			t.Fatalf("no duplicate of %s waits on the watched record", key)
		}
	}
}

// drain forgets the reports not yet read.
func (o *observedStore) drain() {
	for {
		select {
		case <-o.waiting:
		default:
			return
		}
	}
}

// httpAnswer is an HTTP answer, with the time it took.
type httpAnswer struct {
	status   int
	body     string
	replayed bool
	took     time.Duration
	err      error
}

// postKey posts a request with the Idempotency-Key key to url and delivers its
// answer on the channel returned.
func postKey(url, key string) <-chan httpAnswer {
	out := make(chan httpAnswer, 1)
	go func() {
		start := time.Now()
		r, err := http.NewRequest(http.MethodPost, url, strings.NewReader("x"))
		if err != nil {
			out <- httpAnswer{err: err}
			return
		}
		r.Header.Set(idempotency.HeaderKey, key)
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			out <- httpAnswer{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		out <- httpAnswer{
			status:   resp.StatusCode,
			body:     string(b),
			replayed: resp.Header.Get("Idempotent-Replayed") == "true",
			took:     time.Since(start),
			err:      err,
		}
	}()
	return out
}

// awaitAnswer returns the answer from ch, failing t when none comes within d.
func awaitAnswer(t *testing.T, ch <-chan httpAnswer, d time.Duration, what string) httpAnswer {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		return r
	case <-time.After(d):
		t.Fatalf("%s: no answer within %v", what, d)
		return httpAnswer{}
	}
}

// waitMiddleware serves h through the idempotency middleware over s with a
// one-minute lease and the wait bound given. When the test ends, h's gates
// are opened, then the server closed (which waits for its requests).
func waitMiddleware(t *testing.T, s idempotency.Store, h *gatedHandler, wait time.Duration) *httptest.Server {
	srv := httptest.NewServer(idempotency.New(s, idempotency.WithWait(wait), idempotency.WithLease(time.Minute))(h))
	t.Cleanup(func() {
		h.openAll()
		srv.Close()
	})
	return srv
}

// subscriberNode opens s's pub/sub connection with a Watch and returns the
// node holding it, found with CLIENT LIST. The connection stays open, with
// no channel subscribed.
func subscriberNode(t *testing.T, cl *redistest.Cluster, s *redisstore.Store, name string) *redistest.Server {
	t.Helper()
	_, stop, err := s.Watch(ctx, randKey())
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	var found []*redistest.Server
	for _, n := range cl.Nodes {
		if subscribedConns(t, n.Addr(), name) > 0 {
			found = append(found, n)
		}
	}
	if len(found) != 1 {
		t.Fatalf("the store's pub/sub connection found on %d nodes, want 1", len(found))
	}
	return found[0]
}

// clusterKey returns an Idempotency-Key whose record lives on a master
// other than frozen and whose channel hashes to frozen's slots or not, as
// channelOnFrozen says. On a Cluster a new pub/sub connection goes to the
// master of its first channel.
func clusterKey(t *testing.T, cc *redis.ClusterClient, s *redisstore.Store, frozen *redistest.Server, channelOnFrozen bool) string {
	t.Helper()
	master := func(key string) string {
		m, err := cc.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return m.Options().Addr
	}
	for i := 0; i < 1000; i++ {
		key := fmt.Sprintf("pay-%d-%s", i, randKey()[:8])
		sk := idempotency.StorageKey("", key)
		if master(s.RecordKey(sk)) != frozen.Addr() && (master(s.Channel(sk)) == frozen.Addr()) == channelOnFrozen {
			return key
		}
	}
	t.Fatal("no key found")
	return ""
}

// whileFrozen returns the answer from ch and how long after frozen it
// came, thawing node once it came or limit after frozen at the latest: a
// waiter that needs the node (or the Cluster) back gets it, late.
func whileFrozen(t *testing.T, node *redistest.Server, frozen time.Time, ch <-chan httpAnswer, limit time.Duration, what string) (httpAnswer, time.Duration) {
	t.Helper()
	select {
	case r := <-ch:
		took := time.Since(frozen)
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		return r, took
	case <-time.After(time.Until(frozen.Add(limit))):
	}
	node.Thaw()
	r := awaitAnswer(t, ch, 15*time.Second, what)
	return r, time.Since(frozen)
}

// TestFrozenClusterNode freezes the node holding the store's pub/sub
// connection of a 3-master Cluster while the records in play live on the
// other masters. The node timeout is raised to a minute first, so that
// the Cluster does not mark the frozen node as failed (which, without
// replicas, would stop it serving any key).
func TestFrozenClusterNode(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	for _, n := range cl.Nodes {
		if _, err := redistest.Do(n.Addr(), "CONFIG", "SET", "cluster-node-timeout", "60000"); err != nil {
			t.Fatal(err)
		}
	}
	name := clientName()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), ReadTimeout: frozenReadTimeout, ClientName: name})
	t.Cleanup(func() { cc.Close() })

	// A completion during the freeze, on a healthy master, reaches a
	// waiter with a long wait bound: the store notices the frozen
	// connection, wakes the waiter, and its re-check finds the replay.
	t.Run("completion during the freeze", func(t *testing.T) {
		s := newStore(t, cc)
		node := subscriberNode(t, cl, s, name)
		key := clusterKey(t, cc, s, node, false)
		obs := observe(s)
		h := newGatedHandler()
		srv := waitMiddleware(t, obs, h, 10*time.Second)

		holder := postKey(srv.URL, key)
		h.awaitEntered(t, key)
		waiter := postKey(srv.URL, key)
		obs.awaitWaiting(t, key)
		if n := subscribedConns(t, node.Addr(), name); n != 1 {
			t.Fatalf("%d subscribed connections on %s, want the store's", n, node.Addr())
		}

		node.Freeze(t)
		frozen := time.Now()
		h.open(key)
		first := awaitAnswer(t, holder, 5*time.Second, "holder")
		w, took := whileFrozen(t, node, frozen, waiter, 12*time.Second, "waiter")
		node.Thaw()
		t.Logf("waiter answered %v after the freeze", took.Round(time.Millisecond))
		if w.status != http.StatusCreated || !w.replayed || w.body != first.body {
			t.Errorf("waiter got %d %q (replayed %v), want the replay of %q", w.status, w.body, w.replayed, first.body)
		}
		if limit := 3*frozenReadTimeout/2 + time.Second; took > limit {
			t.Errorf("waiter answered %v after the freeze (wait bound 10s); want within %v", took.Round(time.Millisecond), limit)
		}
	})

	// Waiters' bounds hold while the node is frozen: one waiting when it
	// froze and one arriving after, both on keys of healthy masters whose
	// channels hash to the frozen node, so that a new pub/sub connection
	// goes there again. After the thaw a later waiter is woken by the
	// notification.
	t.Run("bound, then notification after the thaw", func(t *testing.T) {
		s := newStore(t, cc)
		node := subscriberNode(t, cl, s, name)
		key := clusterKey(t, cc, s, node, true)
		key2 := clusterKey(t, cc, s, node, true)
		obs := observe(s)
		h := newGatedHandler()
		short := waitMiddleware(t, obs, h, 2*time.Second)
		long := waitMiddleware(t, obs, h, 10*time.Second)

		holder := postKey(long.URL, key)
		h.awaitEntered(t, key)
		postKey(long.URL, key2)
		h.awaitEntered(t, key2)
		waiter := postKey(short.URL, key)
		obs.awaitWaiting(t, key)
		node.Freeze(t)
		frozen := time.Now()
		waiter2 := postKey(short.URL, key2)
		const limit = 2*time.Second + 1500*time.Millisecond
		for _, c := range []struct {
			what string
			ch   <-chan httpAnswer
		}{
			{"waiter since before the freeze", waiter},
			{"waiter arriving during the freeze", waiter2},
		} {
			w, _ := whileFrozen(t, node, frozen, c.ch, 8*time.Second, c.what)
			t.Logf("%s (2s bound) answered after %v", c.what, w.took.Round(time.Millisecond))
			if w.status != http.StatusConflict {
				t.Errorf("%s got %d %q, want 409 (the holder still runs)", c.what, w.status, w.body)
			}
			if w.took > limit {
				t.Errorf("%s (2s bound) answered after %v", c.what, w.took.Round(time.Millisecond))
			}
		}
		node.Thaw()

		obs.drain()
		later := postKey(long.URL, key)
		obs.awaitWaiting(t, key)
		opened := time.Now()
		h.open(key)
		first := awaitAnswer(t, holder, 5*time.Second, "holder")
		l := awaitAnswer(t, later, 10*time.Second, "later waiter")
		took := time.Since(opened)
		t.Logf("later waiter answered %v after the completion", took.Round(time.Millisecond))
		if l.status != http.StatusCreated || !l.replayed || l.body != first.body {
			t.Errorf("later waiter got %d %q (replayed %v), want the replay of %q", l.status, l.body, l.replayed, first.body)
		}
		if took > 2*time.Second {
			t.Errorf("later waiter answered %v after the completion (wait bound 10s, lease 1m): not by the notification", took)
		}
	})
}

// TestFrozenSentinelMaster freezes the master of a Sentinel setup, which
// holds the store's pub/sub connection and the records.
func TestFrozenSentinelMaster(t *testing.T) {
	st := redistest.StartSentinel(t)
	name := clientName()
	fc := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    st.MasterName,
		SentinelAddrs: st.SentinelAddrs(),
		ReadTimeout:   frozenReadTimeout,
		ClientName:    name,
	})
	t.Cleanup(func() { fc.Close() })
	downAfter := func(ms string) {
		t.Helper()
		if _, err := redistest.Do(st.Sentinel.Addr(), "SENTINEL", "SET", st.MasterName, "down-after-milliseconds", ms); err != nil {
			t.Fatal(err)
		}
	}

	// A freeze shorter than the Sentinel's failover detection (raised to
	// a minute here): a waiter's bound holds, and once the master is back
	// a later waiter is woken by the notification.
	t.Run("master comes back", func(t *testing.T) {
		downAfter("60000")
		s := newStore(t, fc)
		obs := observe(s)
		h := newGatedHandler()
		short := waitMiddleware(t, obs, h, 2*time.Second)
		long := waitMiddleware(t, obs, h, 10*time.Second)
		const key = "pay-sentinel"

		holder := postKey(long.URL, key)
		h.awaitEntered(t, key)
		waiter := postKey(short.URL, key)
		obs.awaitWaiting(t, key)
		if n := subscribedConns(t, st.Master.Addr(), name); n != 1 {
			t.Fatalf("%d subscribed connections on the master, want the store's", n)
		}
		st.Master.Freeze(t)
		w := awaitAnswer(t, waiter, 5*time.Second, "waiter with a 2s bound")
		st.Master.Thaw()
		t.Logf("waiter with a 2s bound answered after %v", w.took.Round(time.Millisecond))
		if w.status != http.StatusConflict {
			t.Errorf("waiter got %d %q, want 409 (the holder still runs)", w.status, w.body)
		}
		if w.took > 2*time.Second+1500*time.Millisecond {
			t.Errorf("waiter with a 2s bound answered after %v", w.took)
		}
		if addr, err := st.MasterAddr(); err != nil || addr != st.Master.Addr() {
			t.Fatalf("master is %s (%v), want no failover", addr, err)
		}

		obs.drain()
		later := postKey(long.URL, key)
		obs.awaitWaiting(t, key)
		opened := time.Now()
		h.open(key)
		first := awaitAnswer(t, holder, 5*time.Second, "holder")
		l := awaitAnswer(t, later, 10*time.Second, "later waiter")
		took := time.Since(opened)
		t.Logf("later waiter answered %v after the completion", took.Round(time.Millisecond))
		if l.status != http.StatusCreated || !l.replayed || l.body != first.body {
			t.Errorf("later waiter got %d %q (replayed %v), want the replay of %q", l.status, l.body, l.replayed, first.body)
		}
		if took > 2*time.Second {
			t.Errorf("later waiter answered %v after the completion (wait bound 10s, lease 1m): not by the notification", took)
		}
	})

	// The Sentinel replaces the frozen master: the store drops the
	// connection stuck on it, and a Watch made during the freeze is
	// confirmed on the new master while the old one is still frozen.
	t.Run("master replaced", func(t *testing.T) {
		downAfter("1000")
		s := newStore(t, fc)
		old := st.Master
		key, key2 := randKey(), randKey()
		mustAcquire(t, s, req(key, "t1"), idempotency.Acquired)
		mustAcquire(t, s, req(key2, "t1"), idempotency.Acquired)
		if err := fc.Do(ctx, "WAIT", 1, 2000).Err(); err != nil { // both records on the replica
			t.Fatal(err)
		}
		ch, stop, err := s.Watch(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		old.Freeze(t)
		frozen := time.Now()
		type watched struct {
			ch   <-chan struct{}
			stop func()
			err  error
		}
		pending := make(chan watched, 1)
		go func() {
			wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			defer cancel()
			ch, stop, err := s.Watch(wctx, key2)
			pending <- watched{ch, stop, err}
		}()
		select {
		case <-ch:
		case <-time.After(3*frozenReadTimeout/2 + time.Second):
			t.Error("waiter not woken after the master froze")
		}
		if !redistest.WaitFor(20*time.Second, func() bool {
			addr, err := st.MasterAddr()
			return err == nil && addr != old.Addr()
		}) {
			t.Fatal("no failover")
		}
		failover := time.Since(frozen)
		t.Logf("failover %v after the freeze", failover.Round(time.Millisecond))

		var w watched
		select {
		case w = <-pending:
		case <-time.After(20 * time.Second):
			t.Fatal("Watch made during the freeze did not return")
		}
		if w.err != nil {
			t.Fatalf("Watch made during the freeze, deadline 15s: %v (%v after the freeze)", w.err, time.Since(frozen).Round(time.Millisecond))
		}
		defer w.stop()
		t.Logf("Watch made during the freeze confirmed %v after the freeze", time.Since(frozen).Round(time.Millisecond))
		if err := s.Release(ctx, key2, "t1"); err != nil {
			t.Fatal(err)
		}
		select {
		case <-w.ch:
		case <-time.After(2 * time.Second):
			t.Fatal("waiter on the new master not notified")
		}
	})
}
