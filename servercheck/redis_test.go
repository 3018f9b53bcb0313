package servercheck

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency/internal/redistest"
)

// clientOn returns a client for the server at addr, closed when t ends.
func clientOn(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	return c
}

// checkServer starts a private redis-server with args and returns a client
// on it and the server.
func checkServer(t *testing.T, args ...string) (*redis.Client, *redistest.Server) {
	t.Helper()
	srv := redistest.Start(t, args...)
	return clientOn(t, srv.Addr()), srv
}

func runRedis(t *testing.T, client redis.UniversalClient) Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := Redis(ctx, client)
	if err != nil {
		t.Fatalf("Redis: %v", err)
	}
	return r
}

// finding returns the finding about item (on any node), failing t when
// there is none.
func finding(t *testing.T, r Report, item string) Finding {
	t.Helper()
	for _, f := range r.Findings {
		if f.Item == item {
			return f
		}
	}
	t.Fatalf("no finding %q in %+v", item, r.Findings)
	return Finding{}
}

func wantVerdict(t *testing.T, r Report, item string, want Verdict) Finding {
	t.Helper()
	f := finding(t, r, item)
	if f.Verdict != want {
		t.Errorf("%s: verdict %v, want %v (value %q, detail %q)", item, f.Verdict, want, f.Value, f.Detail)
	}
	return f
}

// safeArgs is a configuration the check passes.
var safeArgs = []string{"--maxmemory-policy", "noeviction", "--maxmemory", "64mb", "--appendonly", "yes", "--appendfsync", "everysec"}

func TestRedisEvictingPolicyFails(t *testing.T) {
	for _, policy := range []string{"allkeys-lru", "volatile-ttl"} {
		t.Run(policy, func(t *testing.T) {
			c, _ := checkServer(t, "--maxmemory-policy", policy, "--maxmemory", "64mb")
			r := runRedis(t, c)
			f := wantVerdict(t, r, "maxmemory-policy", Fail)
			if f.Value != policy {
				t.Errorf("value %q, want %q", f.Value, policy)
			}
			if r.Worst() != Fail {
				t.Errorf("Worst() = %v, want FAIL", r.Worst())
			}
		})
	}
}

func TestRedisSafeConfigPasses(t *testing.T) {
	c, srv := checkServer(t, safeArgs...)
	// A server writing an AOF takes seconds to stop.
	t.Cleanup(func() { redistest.Do(srv.Addr(), "CONFIG", "SET", "appendonly", "no") })
	r := runRedis(t, c)
	if w := r.Worst(); w != OK {
		t.Errorf("Worst() = %v, want OK: %+v", w, r.Findings)
	}
	for _, item := range []string{"role", "version", "maxmemory-policy", "maxmemory", "persistence", "replication"} {
		f := wantVerdict(t, r, item, OK)
		if f.Node != srv.Addr() {
			t.Errorf("%s: node %q, want %q", item, f.Node, srv.Addr())
		}
	}
	wantVerdict(t, r, "clock", Info)
	if f := finding(t, r, "persistence"); f.Value != "appendonly yes, appendfsync everysec" {
		t.Errorf("persistence value %q", f.Value)
	}
}

func TestRedisPersistence(t *testing.T) {
	c, srv := checkServer(t, "--maxmemory", "64mb")
	// A server writing an AOF takes seconds to stop.
	t.Cleanup(func() { redistest.Do(srv.Addr(), "CONFIG", "SET", "appendonly", "no") })
	cases := []struct {
		set   [][]string
		want  Verdict
		value string
	}{
		{[][]string{{"appendonly", "no"}, {"save", ""}}, Warn, `appendonly no, save ""`},
		{[][]string{{"save", "900 1"}}, Warn, `appendonly no, save "900 1"`},
		{[][]string{{"appendonly", "yes"}, {"appendfsync", "no"}}, Warn, "appendonly yes, appendfsync no"},
		{[][]string{{"appendfsync", "always"}}, OK, "appendonly yes, appendfsync always"},
	}
	for _, cs := range cases {
		for _, kv := range cs.set {
			if _, err := redistest.Do(srv.Addr(), "CONFIG", "SET", kv[0], kv[1]); err != nil {
				t.Fatal(err)
			}
		}
		f := wantVerdict(t, runRedis(t, c), "persistence", cs.want)
		if f.Value != cs.value {
			t.Errorf("after %v: value %q, want %q", cs.set, f.Value, cs.value)
		}
	}
}

// setMinReplicas sets min-replicas-to-write n with a lag bound of 10s (so
// that a slow acknowledgement on a loaded machine does not count as a
// replica gone), and waits until the master counts good replicas in time.
func setMinReplicas(t *testing.T, master *redistest.Server, n, good string) {
	t.Helper()
	for _, kv := range [][2]string{{"min-replicas-to-write", n}, {"min-replicas-max-lag", "10"}} {
		if _, err := redistest.Do(master.Addr(), "CONFIG", "SET", kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	// The master counts its replicas in time once it has heard from them
	// since the setting (they acknowledge every second).
	if !redistest.WaitFor(10*time.Second, func() bool {
		info, err := redistest.Do(master.Addr(), "INFO", "replication")
		return err == nil && redistest.InfoField(info, "min_slaves_good_slaves") == good
	}) {
		t.Fatalf("the master never counted %s replicas in time", good)
	}
}

func TestRedisReplicatedMasterWarns(t *testing.T) {
	c, master := checkServer(t, "--maxmemory", "64mb")
	redistest.StartReplica(t, master, "--maxmemory", "64mb")
	r := runRedis(t, c)
	f := wantVerdict(t, r, "replication", Warn)
	if !strings.Contains(f.Value, "min-replicas-to-write 0") || !strings.Contains(f.Detail, "min-replicas-to-write 1") {
		t.Errorf("replication finding %+v", f)
	}
	if r.Worst() != Warn {
		t.Errorf("Worst() = %v, want WARN", r.Worst())
	}

	// Set, with a single replica: a promoted master would refuse writes.
	setMinReplicas(t, master, "1", "1")
	f = wantVerdict(t, runRedis(t, c), "replication", Warn)
	if !strings.Contains(f.Detail, "promoted master") {
		t.Errorf("replication detail %q", f.Detail)
	}

	// More than the replicas there are: the master refuses writes now.
	if _, err := redistest.Do(master.Addr(), "CONFIG", "SET", "min-replicas-to-write", "2"); err != nil {
		t.Fatal(err)
	}
	f = wantVerdict(t, runRedis(t, c), "replication", Fail)
	if !strings.Contains(f.Value, "1 of 1 replicas in time") {
		t.Errorf("replication value %q", f.Value)
	}

	// Two replicas, and writes refused unless one of them is in time: OK.
	redistest.StartReplica(t, master, "--maxmemory", "64mb")
	setMinReplicas(t, master, "1", "2")
	f = wantVerdict(t, runRedis(t, c), "replication", OK)
	if !strings.Contains(f.Value, "2 of 2 replicas in time") {
		t.Errorf("replication value %q", f.Value)
	}
}

// TestRedisSingleNodeNeedsNoMinReplicas: min-replicas-to-write does not
// apply to a master without replicas, so its 0 is no warning there.
func TestRedisSingleNodeNeedsNoMinReplicas(t *testing.T) {
	c, srv := checkServer(t, safeArgs...)
	t.Cleanup(func() { redistest.Do(srv.Addr(), "CONFIG", "SET", "appendonly", "no") })
	if v, err := redistest.Do(srv.Addr(), "CONFIG", "GET", "min-replicas-to-write"); err != nil || !strings.Contains(v, "0") {
		t.Fatalf("min-replicas-to-write: %q, %v", v, err)
	}
	f := wantVerdict(t, runRedis(t, c), "replication", OK)
	if f.Value != "no replicas" {
		t.Errorf("replication value %q, want %q", f.Value, "no replicas")
	}
}

func TestRedisPointedAtReplicaFails(t *testing.T) {
	master := redistest.Start(t)
	replica := redistest.StartReplica(t, master)
	r := runRedis(t, clientOn(t, replica.Addr()))
	wantVerdict(t, r, "role", Fail)
	f := wantVerdict(t, r, "replication", OK)
	if !strings.Contains(f.Value, "link up") {
		t.Errorf("replication value %q", f.Value)
	}
}

func TestRedisSentinel(t *testing.T) {
	st := redistest.StartSentinel(t)
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: st.MasterName, SentinelAddrs: st.SentinelAddrs()})
	t.Cleanup(func() { c.Close() })
	r := runRedis(t, c)
	f := wantVerdict(t, r, "replication", Warn)
	if f.Node != st.Master.Addr() {
		t.Errorf("node %q, want the master %s", f.Node, st.Master.Addr())
	}
	wantVerdict(t, r, "role", OK)

	// Without its replica, a master behind Sentinel still needs
	// min-replicas-to-write (a single node would not); the node tells
	// that it is behind Sentinel, whichever client reaches it.
	st.Replica.Stop()
	if !redistest.WaitFor(10*time.Second, func() bool {
		info, err := redistest.Do(st.Master.Addr(), "INFO", "replication")
		return err == nil && redistest.InfoField(info, "connected_slaves") == "0"
	}) {
		t.Fatal("the master still counts its stopped replica")
	}
	for name, client := range map[string]redis.UniversalClient{"failover client": c, "plain client": clientOn(t, st.Master.Addr())} {
		f := wantVerdict(t, runRedis(t, client), "replication", Warn)
		if f.Value != "min-replicas-to-write 0, 0 replicas" || f.Node != st.Master.Addr() {
			t.Errorf("%s: replication %+v, want a warning about %s", name, f, st.Master.Addr())
		}
	}
}

func TestRedisCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })

	r := runRedis(t, c)
	wantVerdict(t, r, "cluster-state", OK)
	wantVerdict(t, r, "cluster-slots", OK)
	f := wantVerdict(t, r, "cluster-replicas", Warn)
	if !strings.HasPrefix(f.Value, "3 of 3 masters") {
		t.Errorf("cluster-replicas value %q", f.Value)
	}
	wantVerdict(t, r, "clock-spread", OK)
	nodes := map[string]bool{}
	for _, f := range r.Findings {
		if f.Item == "maxmemory-policy" {
			nodes[f.Node] = true
		}
	}
	if len(nodes) != 3 {
		t.Errorf("maxmemory-policy judged on %d nodes, want 3: %v", len(nodes), nodes)
	}
	if r.Findings[0].Node != "" {
		t.Errorf("first finding %+v is not about the deployment", r.Findings[0])
	}

	// The check leaves the client's slot map alone: no CLUSTER SLOTS.
	slotsCalls := func() int {
		n := 0
		for _, node := range cl.Nodes {
			n += redistest.CommandCalls(t, node.Addr(), "cluster|slots")
		}
		return n
	}
	before := slotsCalls()
	runRedis(t, c)
	if after := slotsCalls(); after != before {
		t.Errorf("the check sent CLUSTER SLOTS %d times: it reloaded the client's slot map", after-before)
	}

	// A node that gives up slots leaves them without a master.
	if _, err := redistest.Do(cl.Nodes[0].Addr(), "CLUSTER", "DELSLOTSRANGE", "0", "99"); err != nil {
		if _, err := redistest.Do(cl.Nodes[0].Addr(), "CLUSTER", "DELSLOTS", "0", "1", "2"); err != nil {
			t.Fatal(err)
		}
	}
	var last Finding
	ok := redistest.WaitFor(10*time.Second, func() bool {
		last = finding(t, runRedis(t, c), "cluster-slots")
		return last.Verdict == Fail
	})
	if !ok {
		t.Errorf("cluster-slots after DELSLOTS: %+v, want FAIL", last)
	}
}

func TestRedisRing(t *testing.T) {
	a, b := redistest.Start(t, safeArgs...), redistest.Start(t, "--maxmemory-policy", "allkeys-lru", "--maxmemory", "64mb")
	t.Cleanup(func() { redistest.Do(a.Addr(), "CONFIG", "SET", "appendonly", "no") })
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a.Addr(), "b": b.Addr()}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { ring.Close() })
	verdicts := map[string]Verdict{}
	for _, f := range runRedis(t, ring).Findings {
		if f.Item == "maxmemory-policy" {
			verdicts[f.Node] = f.Verdict
		}
	}
	if len(verdicts) != 2 || verdicts[a.Addr()] != OK || verdicts[b.Addr()] != Fail {
		t.Errorf("maxmemory-policy per shard %v, want OK on %s and FAIL on %s", verdicts, a.Addr(), b.Addr())
	}
}

func TestRedisUnreachable(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: deadAddr(t), MaxRetries: -1})
	defer c.Close()
	if _, err := Redis(context.Background(), c); err == nil {
		t.Error("check of a server that is not there: no error")
	}
}

// TestRedisReturnsByDeadline: without ContextTimeoutEnabled go-redis would
// wait out its 3s ReadTimeout on a server that never answers; the check
// still returns at its context's deadline, or as soon as a context without
// one is cancelled.
func TestRedisReturnsByDeadline(t *testing.T) {
	addr, accepted := silentListener(t)
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := Redis(ctx, c); err == nil || !strings.Contains(err.Error(), "deadline") {
		t.Errorf("check of a silent server: %v, want the deadline's error", err)
	}
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Errorf("the check returned after %v, past its 300ms deadline", d)
	}

	for len(accepted) > 0 { // the first check's connection
		<-accepted
	}
	ctx, cancel = context.WithCancel(context.Background()) // no deadline
	done := make(chan error, 1)
	go func() {
		_, err := Redis(ctx, c)
		done <- err
	}()
	select {
	case <-accepted: // the check is waiting for a reply
	case <-time.After(5 * time.Second):
		t.Fatal("the check did not connect")
	}
	start = time.Now()
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Error("a cancelled check returned no error")
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("the check returned %v after its context was cancelled", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the check did not return after its context was cancelled")
	}
}

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// silentListener returns the address of a listener that accepts
// connections and never answers, closed when t ends, with a channel that
// receives a value for each connection accepted.
func silentListener(t *testing.T) (string, <-chan struct{}) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan struct{}, 16)
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			select {
			case accepted <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String(), accepted
}
