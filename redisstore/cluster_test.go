package redisstore_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/redisstore"
	"github.com/redis/go-redis/v9"
)

// topologyChange changes the Cluster while a handler holds the record in
// slot, whose master is master, and returns the master that serves the
// record afterwards; finish, when not nil, completes the change once the
// record was completed and replayed. refusal is the start of the error
// with which the record's old master refuses the script after the change,
// and replicas the number of replicas the new master has; unlisted says
// that the client's slot map does not list the new master.
type topologyChange struct {
	name, refusal string
	replicas      int
	unlisted      bool
	change        func(t *testing.T, cl *redistest.Cluster, slot int, master *redistest.Server) (owner *redistest.Server, finish func())
}

// topologyChanges returns the changes TestClusterCompleteFollowsTopology
// makes; owner is the test that owns the Cluster, which the masters the
// changes add must outlive.
func topologyChanges(owner *testing.T) []topologyChange {
	return []topologyChange{
		{"ask", "ASK ", 1, false, func(t *testing.T, cl *redistest.Cluster, slot int, master *redistest.Server) (*redistest.Server, func()) {
			// The record moves to another master, but the slot is left
			// migrating: its old master answers ASK.
			to := cl.OtherMaster(t, master)
			cl.BeginSlotMigration(t, slot, master, to)
			cl.MigrateSlotKeys(t, slot, master, to)
			return to, func() { cl.FinishSlotMigration(t, slot, to) }
		}},
		{"ask-new-master", "ASK ", 0, true, func(t *testing.T, cl *redistest.Cluster, slot int, master *redistest.Server) (*redistest.Server, func()) {
			// The same, to a master just added: it serves no slot yet, so
			// the client's slot map does not list it.
			to := cl.AddMaster(owner)
			cl.BeginSlotMigration(t, slot, master, to)
			cl.MigrateSlotKeys(t, slot, master, to)
			return to, func() { cl.FinishSlotMigration(t, slot, to) }
		}},
		{"moved", "MOVED ", 1, false, func(t *testing.T, cl *redistest.Cluster, slot int, master *redistest.Server) (*redistest.Server, func()) {
			to := cl.OtherMaster(t, master)
			cl.MigrateSlot(t, slot, master, to)
			return to, nil
		}},
		{"failover", "MOVED ", 1, false, func(t *testing.T, cl *redistest.Cluster, slot int, master *redistest.Server) (*redistest.Server, func()) {
			return cl.Failover(t, master, slot), nil
		}},
		{"kill", "dial tcp", 0, false, func(t *testing.T, cl *redistest.Cluster, slot int, master *redistest.Server) (*redistest.Server, func()) {
			// The master dies once its replica has the IN_PROGRESS record; the
			// replica takes over after cluster-node-timeout, without a replica
			// of its own.
			replica := cl.ReplicaOf(t, master)
			waitReplicated(t, master, replica)
			master.Kill()
			return cl.WaitMasterOf(t, slot, master, promotedBound), nil
		}},
	}
}

// waitReplicated waits until replica has every write master made so far.
func waitReplicated(t *testing.T, master, replica *redistest.Server) {
	t.Helper()
	info, err := redistest.Do(master.Addr(), "INFO", "replication")
	if err != nil {
		t.Fatal(err)
	}
	want, err := strconv.ParseInt(redistest.InfoField(info, "master_repl_offset"), 10, 64)
	if err != nil {
		t.Fatalf("master_repl_offset: %v", err)
	}
	if !redistest.WaitFor(10*time.Second, func() bool {
		info, err := redistest.Do(replica.Addr(), "INFO", "replication")
		got, _ := strconv.ParseInt(redistest.InfoField(info, "slave_repl_offset"), 10, 64)
		return err == nil && got >= want
	}) {
		t.Fatalf("replica %s did not reach offset %d", replica.Addr(), want)
	}
}

// TestClusterCompleteFollowsTopology runs a request through the middleware
// on a Cluster with replicas and, while its handler runs, moves the
// record's slot to another master (left migrating, so the client meets
// ASK, or finished, MOVED; also to a master just added, which the client's
// slot map does not list), or fails the record's master over to its
// replica (CLUSTER FAILOVER, or SIGKILL and the Cluster's own failover).
// With and without WithWAIT, the handler runs once, Complete lands on the
// record's current master (where the record is COMPLETE) and a duplicate
// replays it. With WithWAIT, the script and WAIT ran together on the new
// master after its old one refused the script, and WAIT was acknowledged by
// the new master's replica (a master just added, or promoted after a
// kill, has none: the shortfall is reported).
func TestClusterCompleteFollowsTopology(t *testing.T) {
	cl := redistest.StartClusterWithReplicas(t, 3)
	changes := topologyChanges(t)
	for _, withWAIT := range []bool{false, true} {
		for _, tc := range changes {
			name := tc.name
			if withWAIT {
				name += "/WAIT"
			}
			t.Run(name, func(t *testing.T) {
				cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: true})
				t.Cleanup(func() { cc.Close() })
				runTopologyChange(t, cl, cc, withWAIT, tc)
			})
		}
	}

	// A client that reads from replicas (ReadOnly) with the scripts sent
	// without their flags line, as for a server before Redis 7: after a
	// failover the old master, now a replica, runs the script on the
	// connection the client kept, and the script's write is refused with
	// READONLY.
	t.Run("failover/ReadOnly/WAIT", func(t *testing.T) {
		cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: true, ReadOnly: true})
		t.Cleanup(func() { cc.Close() })
		tc := changes[3]
		tc.refusal = "READONLY "
		runTopologyChange(t, cl, cc, true, tc, redisstore.UsePlainScripts)
	})
}

// runTopologyChange runs one case of TestClusterCompleteFollowsTopology
// with a Store over cc, with WithWAIT(1, 2s) when withWAIT is set, after
// calling prepare with it.
func runTopologyChange(t *testing.T, cl *redistest.Cluster, cc *redis.ClusterClient, withWAIT bool, tc topologyChange, prepare ...func(*redisstore.Store)) {
	var (
		mu       sync.Mutex
		waitErrs []*redisstore.WAITError
	)
	var opts []redisstore.Option
	if withWAIT {
		opts = append(opts, redisstore.WithWAIT(1, 2*time.Second),
			redisstore.WithWAITErrorHandler(func(_ context.Context, err *redisstore.WAITError) {
				mu.Lock()
				waitErrs = append(waitErrs, err)
				mu.Unlock()
			}))
	}
	waits := &waitLog{}
	cc.OnNewNode(func(n *redis.Client) { n.AddHook(waits.hook(n.Options().Addr)) })
	s := newStore(t, cc, opts...)
	for _, p := range prepare {
		p(s)
	}
	// The first request's outcome: executed, or a store error.
	outcome := make(chan idempotency.Event, 4)
	observe := func(_ context.Context, e idempotency.Event) {
		if e.Kind == idempotency.EventExecuted || e.Kind == idempotency.EventStoreError {
			outcome <- e
		}
	}
	h := &paymentHandler{gate: make(chan struct{}), entered: make(chan struct{}, 1)}
	// A lease long enough that no heartbeat runs during the test: an extend
	// meeting MOVED would refresh the client's slot map on its own.
	mw := idempotency.New(s, idempotency.WithLease(time.Minute), idempotency.WithObserver(observe))
	srv := httptest.NewServer(mw(h))
	t.Cleanup(srv.Close)
	release := sync.OnceFunc(func() { close(h.gate) })
	t.Cleanup(release) // before srv.Close, which waits for the handler

	// A key whose master has a replica (a killed master's has none).
	var (
		key, rkey string
		slot      int
		master    *redistest.Server
	)
	for i := 0; master == nil; i++ {
		if i == 100 {
			t.Fatal("no master with a replica")
		}
		key = "pay-" + randKey()[:16]
		rkey = s.RecordKey(idempotency.StorageKey("", key))
		slot = cl.KeySlot(t, rkey)
		m := cl.MasterOf(t, slot)
		if r, err := cl.Replicas(m); err == nil && len(r) > 0 {
			master = m
		}
	}

	first := make(chan postResult, 1)
	go func() { first <- postAsync(srv.URL+"/payments", key, `{"amount":10}`) }()
	select {
	case <-h.entered:
	case r := <-first:
		t.Fatalf("first request answered %d %s before its handler ran", r.status, r.body)
	case <-time.After(10 * time.Second):
		t.Fatal("handler not entered")
	}

	owner, finish := tc.change(t, cl, slot, master)
	if finish != nil {
		// Finished even when the test fails, so that the next ones find
		// no slot migrating.
		finish = sync.OnceFunc(finish)
		t.Cleanup(finish)
	}
	release()

	r := <-first
	if r.err != nil || r.status != http.StatusCreated {
		t.Fatalf("first request: %d %s %v", r.status, r.body, r.err)
	}
	select {
	case e := <-outcome:
		if e.Kind != idempotency.EventExecuted {
			t.Fatalf("Complete after the change: %v: %v", e.Kind, e.Err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no outcome reported for the first request")
	}

	dup := postAsync(srv.URL+"/payments", key, `{"amount":10}`)
	if dup.err != nil || dup.status != http.StatusCreated || dup.replayed != "true" || !bytes.Equal(dup.body, r.body) {
		t.Fatalf("duplicate: %d replayed=%q %s %v; want the replay of %s", dup.status, dup.replayed, dup.body, dup.err, r.body)
	}
	if n := h.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	if finish != nil {
		finish()
	}
	if got := cl.MasterOf(t, slot); got != owner {
		t.Fatalf("slot %d served by %s, want %s", slot, got.Addr(), owner.Addr())
	}
	if st, err := recordStateAt(owner.Addr(), rkey); err != nil || st != "complete" {
		t.Fatalf("record on %s: state %q, %v; want complete", owner.Addr(), st, err)
	}
	// With a replica, WAIT was acknowledged; without one, the shortfall was
	// reported.
	mu.Lock()
	defer mu.Unlock()
	if tc.replicas > 0 || !withWAIT {
		for _, e := range waitErrs {
			t.Errorf("WAIT: %v", e)
		}
	} else if len(waitErrs) != 1 || waitErrs[0].Acked != 0 || waitErrs[0].Err != nil {
		t.Errorf("WAIT reports %v; want one: 0 of 1 replicas acknowledged", waitErrs)
	}
	if !withWAIT {
		reportTopologyChange(t)
		return
	}
	// The script was refused by the record's old master as expected, then
	// ran on its new master (after NOSCRIPT and EVAL when that master had
	// not run it yet), and WAIT, on the same connection, was answered by
	// that master.
	sent := waits.sent()
	if len(sent) > 1 && sent[0].addr == master.Addr() && redis.HasErrorPrefix(sent[0].scriptErr, "NOSCRIPT") {
		sent = sent[1:] // the old master had not run the script yet
	}
	if len(sent) == 0 {
		t.Fatalf("no pipeline with WAIT sent")
	}
	refused := sent[0]
	if refused.addr != master.Addr() || refused.scriptErr == nil || !strings.HasPrefix(refused.scriptErr.Error(), tc.refusal) {
		t.Errorf("first pipeline: %+v; want the script refused with %q... on %s", refused, tc.refusal, master.Addr())
	}
	if tc.unlisted {
		// The Store reached the new master with a client of its own,
		// which has no hook: the log holds the refused pipeline only. The
		// WAIT report above (0 replicas; the old master has one) shows
		// that WAIT ran on the new master.
		if len(sent) != 1 {
			t.Errorf("pipelines with WAIT: %+v; want only the refused one in the log", sent)
		}
		reportTopologyChange(t)
		return
	}
	if len(sent) < 2 {
		t.Fatalf("pipelines with WAIT: %+v; want a refused one, then one on %s", sent, owner.Addr())
	}
	last := sent[len(sent)-1]
	if last.addr != owner.Addr() || last.scriptErr != nil || last.waitErr != nil || last.acked != int64(tc.replicas) {
		t.Errorf("last pipeline: %+v; want the script and WAIT acknowledged by %d replica(s) on %s", last, tc.replicas, owner.Addr())
	}
	if asked := slices.Contains(last.names, "asking"); asked != (tc.refusal == "ASK ") {
		t.Errorf("last pipeline sent %v", last.names)
	}
	reportTopologyChange(t)
}

// reportTopologyChange reports a passed run of runTopologyChange.
func reportTopologyChange(t *testing.T) {
	if t.Failed() {
		return
	}
	reliability.Report(t, reliability.Result{Scenario: "fault: Cluster slot moved or master failed over during a handler", Store: "redis-cluster",
		Operations: 2, Faults: 1,
		Note: "slot left migrating (ASK, also to a master just added), migrated (MOVED), manual failover, master killed; with and without WithWAIT: 1 execution, completed on the new master and replayed (with WithWAIT it was 2)"})
}

// waitLog records the pipelines that node clients send with WAIT in them.
type waitLog struct {
	mu    sync.Mutex
	pipes []waitPipeline
}

// waitPipeline is a pipeline sent with WAIT in it: the node's address, the
// commands' names, the script's error and WAIT's answer.
type waitPipeline struct {
	addr      string
	names     []string
	scriptErr error
	acked     int64
	waitErr   error
}

// hook returns a go-redis hook recording the pipelines with WAIT that the
// client of the node at addr sends.
func (l *waitLog) hook(addr string) redis.Hook { return &waitHook{log: l, addr: addr} }

func (l *waitLog) sent() []waitPipeline {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.pipes)
}

type waitHook struct {
	log  *waitLog
	addr string
}

func (h *waitHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *waitHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *waitHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		p := waitPipeline{addr: h.addr}
		hasWAIT := false
		for _, c := range cmds {
			p.names = append(p.names, c.Name())
			switch c.Name() {
			case "evalsha", "eval":
				p.scriptErr = c.Err()
			case "wait":
				hasWAIT = true
				p.acked, p.waitErr = c.(*redis.Cmd).Int64()
			}
		}
		if hasWAIT {
			h.log.mu.Lock()
			h.log.pipes = append(h.log.pipes, p)
			h.log.mu.Unlock()
		}
		return err
	}
}

// postResult is what postAsync got.
type postResult struct {
	status   int
	replayed string
	body     []byte
	err      error
}

// postAsync posts body with the Idempotency-Key key, and may run in a
// goroutine of its own: it reports failures in its result.
func postAsync(url, key, body string) postResult {
	r, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return postResult{err: err}
	}
	r.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		return postResult{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return postResult{err: fmt.Errorf("reading the body: %w", err)}
	}
	return postResult{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed"), body: b}
}

func TestSameAddr(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"127.0.0.1:7000", "127.0.0.1:7000", true},
		{"127.0.0.1:7000", "127.0.0.1:7001", false},
		{"127.0.0.1:7000", "127.0.0.2:7000", false},
		{"[::1]:7000", "::1:7000", true}, // Redis writes IPv6 without brackets
		{"[fe80::1]:7000", "FE80::1:7000", true},
		{"redis-0.example:6379", "REDIS-0.example:6379", true},
		{"redis-0.example:6379", "redis-1.example:6379", false},
	} {
		if got := redisstore.SameAddr(tc.a, tc.b); got != tc.want {
			t.Errorf("SameAddr(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

// replyError is an error reply of a Redis server, as redis.Error.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

func TestTopologyError(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{replyError("READONLY You can't write against a read only replica."), true},
		{replyError("ERR Error running script (call to f_x): @user_script:1: -READONLY You can't write against a read only replica."), true},
		{replyError("CLUSTERDOWN The cluster is down"), true},
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{io.EOF, true},
		{replyError("MOVED 3999 127.0.0.1:7001"), false}, // followed, not reloaded for
		{replyError("OOM command not allowed when used memory > 'maxmemory'."), false},
		{replyError("NOSCRIPT No matching script."), false},
		{context.DeadlineExceeded, false},
		{fmt.Errorf("wrapped: %w", context.Canceled), false},
	} {
		if got := redisstore.TopologyError(tc.err); got != tc.want {
			t.Errorf("TopologyError(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
