package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// The stores of this test binary, those of the external test package's
// helpers included, start no server check unless a test asks for one
// (WithStartupCheck, or TestStartupCheckDefaultAndOff, which turns the
// default back on): the check's commands would show in the tests that count
// commands, and on a Cluster its first command races the test's own for
// the client's first slot map, which a test that changes the topology
// while a request runs needs to be the one loaded before the change.
func init() { startupCheckByDefault = false }

// checkServer starts a private redis-server with args and returns a Store
// on it.
func checkServer(t *testing.T, args ...string) (*Store, *redistest.Server) {
	t.Helper()
	srv := redistest.Start(t, args...)
	return storeOn(t, srv.Addr()), srv
}

func storeOn(t *testing.T, addr string) *Store {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	s := New(c, WithoutStartupCheck())
	t.Cleanup(func() { s.Close() })
	return s
}

func runCheck(t *testing.T, s *Store) Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := s.Check(ctx)
	if err != nil {
		t.Fatalf("Check: %v", err)
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

// safeArgs is a configuration Check passes.
var safeArgs = []string{"--maxmemory-policy", "noeviction", "--maxmemory", "64mb", "--appendonly", "yes", "--appendfsync", "everysec"}

func TestCheckEvictingPolicyFails(t *testing.T) {
	for _, policy := range []string{"allkeys-lru", "volatile-ttl"} {
		t.Run(policy, func(t *testing.T) {
			s, _ := checkServer(t, "--maxmemory-policy", policy, "--maxmemory", "64mb")
			r := runCheck(t, s)
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

func TestCheckSafeConfigPasses(t *testing.T) {
	s, srv := checkServer(t, safeArgs...)
	r := runCheck(t, s)
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

func TestCheckPersistence(t *testing.T) {
	s, srv := checkServer(t, "--maxmemory", "64mb")
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
	for _, c := range cases {
		for _, kv := range c.set {
			if _, err := redistest.Do(srv.Addr(), "CONFIG", "SET", kv[0], kv[1]); err != nil {
				t.Fatal(err)
			}
		}
		f := wantVerdict(t, runCheck(t, s), "persistence", c.want)
		if f.Value != c.value {
			t.Errorf("after %v: value %q, want %q", c.set, f.Value, c.value)
		}
	}
}

func TestCheckReplicatedMasterWarns(t *testing.T) {
	s, master := checkServer(t, "--maxmemory", "64mb")
	redistest.StartReplica(t, master, "--maxmemory", "64mb")
	r := runCheck(t, s)
	f := wantVerdict(t, r, "replication", Warn)
	if !strings.Contains(f.Value, "min-replicas-to-write 0") || !strings.Contains(f.Detail, "min-replicas-to-write 1") {
		t.Errorf("replication finding %+v", f)
	}
	if r.Worst() != Warn {
		t.Errorf("Worst() = %v, want WARN", r.Worst())
	}

	// Set, with a single replica: a promoted master would refuse writes.
	// A lag bound of 10s keeps the replica in time on a loaded machine.
	for _, kv := range [][2]string{{"min-replicas-to-write", "1"}, {"min-replicas-max-lag", "10"}} {
		if _, err := redistest.Do(master.Addr(), "CONFIG", "SET", kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	// The master counts its replicas in time once it has heard from the
	// replica since the setting (it acknowledges every second).
	if !redistest.WaitFor(10*time.Second, func() bool {
		info, err := redistest.Do(master.Addr(), "INFO", "replication")
		return err == nil && redistest.InfoField(info, "min_slaves_good_slaves") == "1"
	}) {
		t.Fatal("the master never counted its replica in time")
	}
	f = wantVerdict(t, runCheck(t, s), "replication", Warn)
	if !strings.Contains(f.Detail, "promoted master") {
		t.Errorf("replication detail %q", f.Detail)
	}

	// More than the replicas there are: the master refuses writes now.
	if _, err := redistest.Do(master.Addr(), "CONFIG", "SET", "min-replicas-to-write", "2"); err != nil {
		t.Fatal(err)
	}
	f = wantVerdict(t, runCheck(t, s), "replication", Fail)
	if !strings.Contains(f.Value, "1 of 1 replicas in time") {
		t.Errorf("replication value %q", f.Value)
	}
}

// TestCheckSingleNodeNeedsNoMinReplicas: min-replicas-to-write does not
// apply to a master without replicas, so its 0 is no warning there.
func TestCheckSingleNodeNeedsNoMinReplicas(t *testing.T) {
	s, srv := checkServer(t, safeArgs...)
	if v, err := redistest.Do(srv.Addr(), "CONFIG", "GET", "min-replicas-to-write"); err != nil || !strings.Contains(v, "0") {
		t.Fatalf("min-replicas-to-write: %q, %v", v, err)
	}
	f := wantVerdict(t, runCheck(t, s), "replication", OK)
	if f.Value != "no replicas" {
		t.Errorf("replication value %q, want %q", f.Value, "no replicas")
	}
}

func TestCheckPointedAtReplicaFails(t *testing.T) {
	master := redistest.Start(t)
	replica := redistest.StartReplica(t, master)
	r := runCheck(t, storeOn(t, replica.Addr()))
	wantVerdict(t, r, "role", Fail)
	f := wantVerdict(t, r, "replication", OK)
	if !strings.Contains(f.Value, "link up") {
		t.Errorf("replication value %q", f.Value)
	}
}

func TestCheckSentinel(t *testing.T) {
	st := redistest.StartSentinel(t)
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: st.MasterName, SentinelAddrs: st.SentinelAddrs()})
	t.Cleanup(func() { c.Close() })
	s := New(c)
	t.Cleanup(func() { s.Close() })
	r := runCheck(t, s)
	f := wantVerdict(t, r, "replication", Warn)
	if f.Node != st.Master.Addr() {
		t.Errorf("node %q, want the master %s", f.Node, st.Master.Addr())
	}
	wantVerdict(t, r, "role", OK)
}

func TestCheckCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	s := New(c)
	t.Cleanup(func() { s.Close() })

	r := runCheck(t, s)
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
	runCheck(t, s)
	if after := slotsCalls(); after != before {
		t.Errorf("Check sent CLUSTER SLOTS %d times: it reloaded the client's slot map", after-before)
	}

	// A node that gives up slots leaves them without a master.
	if _, err := redistest.Do(cl.Nodes[0].Addr(), "CLUSTER", "DELSLOTSRANGE", "0", "99"); err != nil {
		if _, err := redistest.Do(cl.Nodes[0].Addr(), "CLUSTER", "DELSLOTS", "0", "1", "2"); err != nil {
			t.Fatal(err)
		}
	}
	var last Finding
	ok := redistest.WaitFor(10*time.Second, func() bool {
		last = finding(t, runCheck(t, s), "cluster-slots")
		return last.Verdict == Fail
	})
	if !ok {
		t.Errorf("cluster-slots after DELSLOTS: %+v, want FAIL", last)
	}
}

func TestCheckClosedStore(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	s := New(c, WithoutStartupCheck())
	s.Close()
	if _, err := s.Check(context.Background()); !errors.Is(err, idempotency.ErrStoreClosed) {
		t.Errorf("Check on a closed store: %v, want ErrStoreClosed", err)
	}
}

func TestCheckUnreachable(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: deadAddr(t), MaxRetries: -1})
	defer c.Close()
	s := New(c, WithoutStartupCheck())
	defer s.Close()
	if _, err := s.Check(context.Background()); err == nil {
		t.Error("Check of a server that is not there: no error")
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

// silentAddr returns the address of a listener that accepts connections
// and never answers, closed when t ends.
func silentAddr(t *testing.T) string {
	addr, _ := silentListener(t)
	return addr
}

// silentListener is silentAddr, with a channel that receives a value for
// each connection accepted.
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

// recorder is a slog.Handler that keeps every record.
type recorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *recorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r.Clone())
	return nil
}
func (h *recorder) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recorder) WithGroup(string) slog.Handler      { return h }

func (h *recorder) all() []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]slog.Record(nil), h.records...)
}

func attr(r slog.Record, key string) string {
	var v string
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value.String()
			return false
		}
		return true
	})
	return v
}

// waitDone waits for done, failing t after a bound.
func waitDone(t *testing.T, done <-chan struct{}, bound time.Duration) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(bound):
		t.Fatalf("CheckAndWarn did not finish within %v", bound)
	}
}

func TestCheckAndWarnLogsUnsafeSettings(t *testing.T) {
	s, _ := checkServer(t, "--maxmemory-policy", "allkeys-lru", "--maxmemory", "64mb")
	h := &recorder{}
	done := s.CheckAndWarn(slog.New(h))
	waitDone(t, done, 10*time.Second)

	byItem := map[string]slog.Record{}
	for _, r := range h.all() {
		byItem[attr(r, "item")] = r
	}
	policy, ok := byItem["maxmemory-policy"]
	if !ok {
		t.Fatalf("no record for maxmemory-policy among %d records", len(h.all()))
	}
	if policy.Level != slog.LevelError || attr(policy, "value") != "allkeys-lru" {
		t.Errorf("maxmemory-policy record: level %v, value %q", policy.Level, attr(policy, "value"))
	}
	// redistest's servers keep nothing on disk.
	persistence, ok := byItem["persistence"]
	if !ok || persistence.Level != slog.LevelWarn {
		t.Errorf("persistence record: %v (present %v)", persistence.Level, ok)
	}
	if _, ok := byItem["version"]; ok {
		t.Error("an OK finding (version) was logged")
	}
}

func TestCheckAndWarnQuietWhenSafe(t *testing.T) {
	s, _ := checkServer(t, safeArgs...)
	h := &recorder{}
	waitDone(t, s.CheckAndWarn(slog.New(h)), 10*time.Second)
	if n := len(h.all()); n != 0 {
		t.Errorf("%d records logged for a safe server: %v", n, h.all())
	}
}

func TestCheckAndWarnNeverBlocks(t *testing.T) {
	defer func(d time.Duration) { startupCheckTimeout = d }(startupCheckTimeout)
	startupCheckTimeout = 300 * time.Millisecond

	// Without ContextTimeoutEnabled go-redis would wait out its 3s
	// ReadTimeout; the check still ends at its own bound.
	c := redis.NewClient(&redis.Options{Addr: silentAddr(t), MaxRetries: -1})
	defer c.Close()
	s := New(c, WithoutStartupCheck())
	defer s.Close()
	h := &recorder{}
	start := time.Now()
	done := s.CheckAndWarn(slog.New(h))
	if d := time.Since(start); d > 50*time.Millisecond {
		t.Errorf("CheckAndWarn took %v to return", d)
	}
	waitDone(t, done, 2*time.Second)
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Errorf("the check ran %v, past its 300ms bound", d)
	}
	recs := h.all()
	if len(recs) != 1 || recs[0].Level != slog.LevelWarn || !strings.Contains(recs[0].Message, "could not check") {
		t.Errorf("records %v, want one warning that the check could not run", recs)
	}
}

func TestCheckAndWarnSilentAfterClose(t *testing.T) {
	defer func(d time.Duration) { startupCheckTimeout = d }(startupCheckTimeout)
	startupCheckTimeout = 200 * time.Millisecond
	c := redis.NewClient(&redis.Options{Addr: silentAddr(t), MaxRetries: -1})
	defer c.Close()
	s := New(c, WithoutStartupCheck())
	h := &recorder{}
	done := s.CheckAndWarn(slog.New(h))
	s.Close()
	waitDone(t, done, 2*time.Second)
	if n := len(h.all()); n != 0 {
		t.Errorf("%d records logged after Close", n)
	}
}

func TestCheckAndWarnDefaultLogger(t *testing.T) {
	s, _ := checkServer(t, "--maxmemory-policy", "allkeys-random", "--maxmemory", "64mb")
	h := &recorder{}
	defer func(l *slog.Logger) { slog.SetDefault(l) }(slog.Default())
	slog.SetDefault(slog.New(h))
	waitDone(t, s.CheckAndWarn(nil), 10*time.Second)
	found := false
	for _, r := range h.all() {
		found = found || attr(r, "item") == "maxmemory-policy"
	}
	if !found {
		t.Error("a nil logger did not log through slog.Default()")
	}
}

// startupStore returns a Store on addr whose start-up check logs to a
// recorder, with the recorder and how long New took.
func startupStore(t *testing.T, addr string) (*Store, *recorder, time.Duration) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	h := &recorder{}
	start := time.Now()
	s := New(c, WithStartupCheck(slog.New(h)))
	took := time.Since(start)
	t.Cleanup(func() { s.Close() })
	if s.startup == nil {
		t.Fatal("New started no check")
	}
	return s, h, took
}

// byItem returns the records logged per item.
func byItem(h *recorder) map[string]slog.Record {
	m := map[string]slog.Record{}
	for _, r := range h.all() {
		m[attr(r, "item")] = r
	}
	return m
}

func TestStartupCheckWarnsOnEvictingPolicy(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory-policy", "allkeys-lru", "--maxmemory", "64mb")
	s, h, _ := startupStore(t, srv.Addr())
	waitDone(t, s.startup, 10*time.Second)
	r, ok := byItem(h)["maxmemory-policy"]
	if !ok {
		t.Fatalf("no record for maxmemory-policy among %v", h.all())
	}
	if r.Level != slog.LevelError || attr(r, "value") != "allkeys-lru" || attr(r, "node") != srv.Addr() ||
		r.Message != "redisstore: unsafe Redis configuration" || !strings.Contains(attr(r, "detail"), "noeviction") {
		t.Errorf("maxmemory-policy record: %v %q %v", r.Level, r.Message, attr(r, "value"))
	}
}

func TestStartupCheckQuietOnSafeServer(t *testing.T) {
	srv := redistest.Start(t, safeArgs...)
	// A server writing an AOF takes seconds to stop.
	t.Cleanup(func() { redistest.Do(srv.Addr(), "CONFIG", "SET", "appendonly", "no") })
	s, h, _ := startupStore(t, srv.Addr())
	waitDone(t, s.startup, 10*time.Second)
	if n := len(h.all()); n != 0 {
		t.Errorf("%d records logged for a safe server: %v", n, h.all())
	}
}

// TestStartupCheckWarnsOnReplicatedMaster: a master with a replica and
// min-replicas-to-write 0 is warned about, once the setting is there no
// more.
func TestStartupCheckWarnsOnReplicatedMaster(t *testing.T) {
	master := redistest.Start(t, safeArgs...)
	t.Cleanup(func() { redistest.Do(master.Addr(), "CONFIG", "SET", "appendonly", "no") })
	redistest.StartReplica(t, master, "--maxmemory", "64mb")
	s, h, _ := startupStore(t, master.Addr())
	waitDone(t, s.startup, 10*time.Second)
	r, ok := byItem(h)["replication"]
	if !ok || r.Level != slog.LevelWarn || !strings.Contains(attr(r, "value"), "min-replicas-to-write 0") {
		t.Fatalf("replication record %v (present %v) among %v", r, ok, h.all())
	}

	// Two replicas, and writes refused unless one of them is in time (a
	// lag bound of 10s, so that a slow ack on a loaded machine does not
	// count as a replica gone).
	redistest.StartReplica(t, master, "--maxmemory", "64mb")
	for _, kv := range [][2]string{{"min-replicas-to-write", "1"}, {"min-replicas-max-lag", "10"}} {
		if _, err := redistest.Do(master.Addr(), "CONFIG", "SET", kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if !redistest.WaitFor(10*time.Second, func() bool {
		info, err := redistest.Do(master.Addr(), "INFO", "replication")
		return err == nil && redistest.InfoField(info, "min_slaves_good_slaves") == "2"
	}) {
		t.Fatal("the replicas did not catch up")
	}
	s, h, _ = startupStore(t, master.Addr())
	waitDone(t, s.startup, 10*time.Second)
	if recs := h.all(); len(recs) != 0 {
		t.Errorf("records for a master with min-replicas-to-write 1 and two replicas: %v", recs)
	}
}

// TestStartupCheckDoesNotDelayNew: New returns at once on a server that
// never answers; the check ends at its bound with one warning.
func TestStartupCheckDoesNotDelayNew(t *testing.T) {
	defer func(d time.Duration) { startupCheckTimeout = d }(startupCheckTimeout)
	startupCheckTimeout = 300 * time.Millisecond
	for name, addr := range map[string]string{"silent": silentAddr(t), "refusing": deadAddr(t)} {
		t.Run(name, func(t *testing.T) {
			s, h, took := startupStore(t, addr)
			if took > 50*time.Millisecond {
				t.Errorf("New took %v", took)
			}
			start := time.Now()
			waitDone(t, s.startup, 3*time.Second)
			if d := time.Since(start); d > 1500*time.Millisecond {
				t.Errorf("the check ran %v, past its 300ms bound", d)
			}
			recs := h.all()
			if len(recs) != 1 || recs[0].Level != slog.LevelWarn || !strings.Contains(recs[0].Message, "could not check") {
				t.Errorf("records %v, want one warning that the check could not run", recs)
			}
		})
	}
}

// TestStartupCheckEndsAtClose: Close ends a check that is still waiting
// for the server, and nothing is logged.
func TestStartupCheckEndsAtClose(t *testing.T) {
	addr, accepted := silentListener(t)
	s, h, _ := startupStore(t, addr)
	select {
	case <-accepted: // the check is waiting for a reply
	case <-time.After(5 * time.Second):
		t.Fatal("the check did not connect")
	}
	start := time.Now()
	s.Close()
	waitDone(t, s.startup, 2*time.Second)
	if d := time.Since(start); d > time.Second {
		t.Errorf("the check ended %v after Close, want at once (its own bound is %v)", d, startupCheckTimeout)
	}
	if n := len(h.all()); n != 0 {
		t.Errorf("%d records logged after Close: %v", n, h.all())
	}
}

func TestStartupCheckDefaultAndOff(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory-policy", "allkeys-lfu", "--maxmemory", "64mb")
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { c.Close() })
	h := &recorder{}
	defer func(l *slog.Logger) { slog.SetDefault(l) }(slog.Default())
	slog.SetDefault(slog.New(h))
	defer func(on bool) { startupCheckByDefault = on }(startupCheckByDefault)
	startupCheckByDefault = true

	s := New(c)
	defer s.Close()
	if s.startup == nil {
		t.Fatal("New without options started no check")
	}
	waitDone(t, s.startup, 10*time.Second)
	if r, ok := byItem(h)["maxmemory-policy"]; !ok || attr(r, "value") != "allkeys-lfu" {
		t.Errorf("the default check did not log through slog.Default(): %v", h.all())
	}

	off := New(c, WithoutStartupCheck())
	defer off.Close()
	if off.startup != nil {
		t.Error("WithoutStartupCheck: New started a check")
	}

	defer func() {
		if recover() == nil {
			t.Error("WithStartupCheck(nil) did not panic")
		}
	}()
	WithStartupCheck(nil)
}

// node returns a nodeInfo as a healthy single master would give it, with
// the fields in set changed (an empty value deletes the field).
func node(set map[string]string, config map[string]string) nodeInfo {
	info := map[string]string{
		"role": "master", "redis_version": "7.2.4", "maxmemory_policy": "noeviction",
		"maxmemory": "1000", "used_memory": "100", "aof_enabled": "1", "connected_slaves": "0",
	}
	for k, v := range set {
		if v == "" {
			delete(info, k)
		} else {
			info[k] = v
		}
	}
	cfg := map[string]string{"appendfsync": "everysec", "save": "", "min-replicas-to-write": "0", "min-replicas-max-lag": "10"}
	for k, v := range config {
		cfg[k] = v
	}
	return nodeInfo{addr: "10.0.0.1:6379", info: info, config: cfg}
}

func TestJudgeNode(t *testing.T) {
	refused := errors.New("ERR unknown command 'CONFIG'")
	cases := []struct {
		name string
		n    nodeInfo
		kind deployment
		item string
		want Verdict
	}{
		{"healthy", node(nil, nil), single, "version", OK},
		{"redis 6", node(map[string]string{"redis_version": "6.2.14"}, nil), single, "version", Warn},
		{"valkey", node(map[string]string{"valkey_version": "8.0.1"}, nil), single, "version", OK},
		{"replica on a single-node client", node(map[string]string{"role": "slave", "master_link_status": "up"}, nil), single, "role", Fail},
		{"replica in a cluster", node(map[string]string{"role": "slave", "master_link_status": "up"}, nil), cluster, "role", Info},
		{"replica link down", node(map[string]string{"role": "slave", "master_link_status": "down"}, nil), cluster, "replication", Warn},
		{"90% used", node(map[string]string{"used_memory": "900"}, nil), single, "maxmemory", Warn},
		{"89% used", node(map[string]string{"used_memory": "890"}, nil), single, "maxmemory", OK},
		{"full", node(map[string]string{"used_memory": "1000"}, nil), single, "maxmemory", Fail},
		{"past maxmemory", node(map[string]string{"used_memory": "1150"}, nil), single, "maxmemory", Fail},
		{"no maxmemory", node(map[string]string{"maxmemory": "0"}, nil), single, "maxmemory", Warn},
		{"allkeys-lfu", node(map[string]string{"maxmemory_policy": "allkeys-lfu"}, nil), single, "maxmemory-policy", Fail},
		{"sentinel without min-replicas", node(nil, nil), sentinel, "replication", Warn},
		{"sentinel with min-replicas and two replicas", node(
			map[string]string{"connected_slaves": "2", "min_slaves_good_slaves": "2"},
			map[string]string{"min-replicas-to-write": "1", "min-replicas-max-lag": "1"}), sentinel, "replication", OK},
		{"min-replicas set, CONFIG refused", func() nodeInfo {
			n := node(map[string]string{"connected_slaves": "2", "min_slaves_good_slaves": "2"}, nil)
			n.config, n.configErr = map[string]string{}, refused
			return n
		}(), single, "replication", OK},
		{"min-replicas unset, CONFIG refused", func() nodeInfo {
			n := node(map[string]string{"connected_slaves": "2"}, nil)
			n.config, n.configErr = map[string]string{}, refused
			return n
		}(), single, "replication", Warn},
		{"persistence, CONFIG refused, AOF off", func() nodeInfo {
			n := node(map[string]string{"aof_enabled": "0"}, nil)
			n.config, n.configErr = map[string]string{}, refused
			return n
		}(), single, "persistence", Info},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got *Finding
			for _, f := range judgeNode(c.n, c.kind) {
				if f.Item == c.item {
					got = &f
				}
			}
			if got == nil {
				t.Fatalf("no %s finding", c.item)
			}
			if got.Verdict != c.want {
				t.Errorf("%s: %v (%q: %s), want %v", c.item, got.Verdict, got.Value, got.Detail, c.want)
			}
			if got.Node != c.n.addr || got.Detail == "" || got.Value == "" {
				t.Errorf("finding incomplete: %+v", *got)
			}
		})
	}
}

func TestJudgeLayout(t *testing.T) {
	nodes := parseClusterNodes(strings.Join([]string{
		"a1 10.0.0.1:6379@16379 myself,master - 0 0 1 connected 0-5460",
		"a2 10.0.0.2:6379@16379 master - 0 0 2 connected 5461-10922 [10923->-a3]",
		"a3 10.0.0.3:6379@16379 master,fail - 0 0 3 connected 10923-16383",
		"r1 10.0.0.4:6379@16379 slave a1 0 0 1 connected",
		"r2 10.0.0.5:6379@16379 slave,fail a2 0 0 2 connected",
	}, "\n"))
	f := judgeLayout(map[string]string{"cluster_state": "fail"}, nodes)
	want := map[string]Verdict{"cluster-state": Fail, "cluster-slots": Fail, "cluster-replicas": Warn}
	for _, x := range f {
		if want[x.Item] != x.Verdict {
			t.Errorf("%s: %v (%s), want %v", x.Item, x.Verdict, x.Value, want[x.Item])
		}
	}
	if f[1].Value != "10923 of 16384 slots" {
		t.Errorf("cluster-slots value %q", f[1].Value)
	}
	if !strings.Contains(f[2].Value, "10.0.0.2:6379") || !strings.Contains(f[2].Value, "10.0.0.3:6379") || strings.Contains(f[2].Value, "10.0.0.1:6379") {
		t.Errorf("cluster-replicas value %q", f[2].Value)
	}
}

func TestJudgeClockSpread(t *testing.T) {
	nodes := []nodeInfo{{addr: "a", offset: -200 * time.Millisecond}, {addr: "b", offset: 900 * time.Millisecond}, {addr: "c", clockErr: errors.New("x")}}
	f := judgeClockSpread(nodes)
	if f.Verdict != Warn || f.Value != "1.1s between a and b" {
		t.Errorf("spread %+v, want WARN for 1.1s", f)
	}
	nodes[1].offset = 700 * time.Millisecond
	if f := judgeClockSpread(nodes); f.Verdict != OK {
		t.Errorf("spread %+v, want OK", f)
	}
}

func TestVerdictText(t *testing.T) {
	b, err := json.Marshal(Report{Findings: []Finding{{Item: "x", Verdict: Warn}}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"verdict":"WARN"`) {
		t.Errorf("JSON %s", b)
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil || r.Findings[0].Verdict != Warn {
		t.Errorf("round trip: %+v, %v", r, err)
	}
	if _, err := json.Marshal(Verdict(9)); err == nil {
		t.Error("an unknown verdict marshalled")
	}
	if s := Verdict(9).String(); s != "Verdict("+strconv.Itoa(9)+")" {
		t.Errorf("String of an unknown verdict: %q", s)
	}
}
