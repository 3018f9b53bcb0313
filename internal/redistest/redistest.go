// Package redistest starts private Redis servers for tests: a single node, a
// node with a replica, a three-master Cluster and a Sentinel setup. Every
// server listens on a free loopback port, keeps its files in the test's
// temporary directory and is stopped by PID when the test ends.
//
// When redis-server (or redis-cli, for a Cluster) is not installed the
// calling test is skipped with a message saying so, unless the environment
// sets IDEMPOTENCY_REQUIRE_REDIS=1, in which case it fails.
package redistest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RequireEnv is the environment variable that turns a missing Redis
// installation from a skipped test into a failed one.
const RequireEnv = "IDEMPOTENCY_REQUIRE_REDIS"

// AddrEnv names the environment variable holding the address of an existing
// Redis server that Addr returns instead of starting one.
const AddrEnv = "REDIS_ADDR"

// startTimeout bounds how long a server may take to answer PING.
const startTimeout = 10 * time.Second

// Addr returns the address of a Redis server for t: the value of REDIS_ADDR
// when it is set, else a private redis-server started for t and stopped when
// t ends. Tests sharing a server given through REDIS_ADDR must keep their
// keys under a unique prefix (see Prefix) and never flush it.
func Addr(t testing.TB) string {
	t.Helper()
	if addr := os.Getenv(AddrEnv); addr != "" {
		return addr
	}
	return Start(t).Addr()
}

// Prefix returns a key prefix unique to this call, such as
// "idemtest:3f9a0c1b2d4e5f60:".
func Prefix() string {
	return fmt.Sprintf("idemtest:%016x:", rand.Uint64())
}

// need skips (or, under IDEMPOTENCY_REQUIRE_REDIS=1, fails) t when one of
// the named programs is not on PATH.
func need(t testing.TB, hint string, programs ...string) {
	t.Helper()
	for _, p := range programs {
		if _, err := exec.LookPath(p); err != nil {
			msg := p + " not found: " + hint
			if os.Getenv(RequireEnv) == "1" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
}

// Server is a redis-server process owned by a test.
type Server struct {
	t    testing.TB
	port int
	dir  string
	args []string // the command line, without the port
	env  []string // added to the environment

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited and been reaped
}

// Start starts a private redis-server for t with the extra configuration
// arguments given (each "--name value" pair as separate strings) and returns
// once it answers PING. The server is stopped when t ends. It never uses
// REDIS_ADDR.
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	need(t, "install redis-server/redis-tools or set REDIS_ADDR", "redis-server")
	dir := t.TempDir()
	s, err := launch(dir, false, nil, dataArgs(dir, args)...)
	return own(t, "redis-server", s, err)
}

// Launch starts redis-server (found on PATH) on a free loopback port with
// its files in dir and the extra configuration arguments given, and returns
// once it answers PING. It is Start for programs that run outside a test,
// such as a load command: the caller stops the server with Stop.
func Launch(dir string, args ...string) (*Server, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, fmt.Errorf("redistest: redis-server not found on PATH: %w", err)
	}
	return launch(dir, false, nil, dataArgs(dir, args)...)
}

// dataArgs returns the command line of a data node keeping its files in
// dir: no persistence, immediate diskless replication, then extra.
func dataArgs(dir string, extra []string) []string {
	return append([]string{
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", dir,
		"--repl-diskless-sync-delay", "0",
	}, extra...)
}

// launch starts redis-server in dir with args and env on a free loopback
// port (whose Cluster bus port is free too, with bus set), trying another
// port when the server does not come up.
func launch(dir string, bus bool, env []string, args ...string) (*Server, error) {
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		s := &Server{dir: dir, args: args, env: env}
		if s.port, err = freePort(bus); err != nil {
			return nil, err
		}
		if err = s.start(); err == nil {
			return s, nil
		}
	}
	return nil, err
}

// own hands s, as launch returned it with err, to t: it fails t when the
// launch failed and stops s when t ends.
func own(t testing.TB, what string, s *Server, err error) *Server {
	t.Helper()
	if err != nil {
		t.Fatalf("redistest: starting %s: %v", what, err)
	}
	s.t = t
	t.Cleanup(s.Stop)
	return s
}

// Addr returns the server's address, "127.0.0.1:<port>".
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Port returns the server's TCP port.
func (s *Server) Port() int { return s.port }

// Dir returns the server's working directory.
func (s *Server) Dir() string { return s.dir }

// PID returns the process ID of the running server, or 0 when it is stopped.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// start runs the server and waits until it answers PING.
func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("already running")
	}
	logPath := filepath.Join(s.dir, "redis.log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := exec.Command("redis-server", append(slices.Clone(s.args), "--port", strconv.Itoa(s.port))...)
	cmd.Stdout, cmd.Stderr, cmd.Dir = f, f, s.dir
	cmd.Env = append(os.Environ(), s.env...)
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.cmd, s.exited = cmd, exited
	deadline := time.Now().Add(startTimeout)
	for {
		if reply, err := Do(s.Addr(), "PING"); err == nil && reply == "PONG" {
			return nil
		}
		select {
		case <-exited:
			s.cmd = nil
			out, _ := os.ReadFile(logPath)
			return fmt.Errorf("redis-server on port %d exited: %s", s.port, lastLines(string(out), 5))
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.endLocked(syscall.SIGTERM)
			return fmt.Errorf("redis-server on port %d did not answer PING within %v", s.port, startTimeout)
		}
	}
}

// Stop stops the server by its PID and waits for it to exit. Stopping a
// stopped server does nothing.
func (s *Server) Stop() { s.end(syscall.SIGTERM) }

// Kill stops the server with SIGKILL, as a crash would, and waits for it to
// exit. Killing a stopped server does nothing.
func (s *Server) Kill() { s.end(syscall.SIGKILL) }

func (s *Server) end(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endLocked(sig)
}

// endLocked sends sig to the running server and waits for it to exit,
// killing it after 5 seconds.
func (s *Server) endLocked(sig syscall.Signal) {
	if s.cmd == nil {
		return
	}
	p, exited := s.cmd.Process, s.exited
	s.cmd = nil
	_ = p.Signal(sig)
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		_ = p.Kill()
		<-exited
	}
}

// Restart stops the server and starts it again on the same port with the
// same configuration (servers started for a test only). Data is not kept:
// the new process starts empty, with an empty script cache.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	var err error
	// The port may linger briefly.
	if !WaitFor(5*time.Second, func() bool { err = s.start(); return err == nil }) {
		s.t.Fatalf("redistest: restarting redis-server: %v", err)
	}
}

// StartReplica starts a private redis-server replicating master and waits
// until the replication link is up.
func StartReplica(t testing.TB, master *Server, args ...string) *Server {
	t.Helper()
	r := Start(t, append([]string{"--replicaof", "127.0.0.1", strconv.Itoa(master.Port())}, args...)...)
	waitLinkUp(t, r)
	waitFor(t, "master sees its replica", func() bool {
		n, _ := strconv.Atoi(infoOf(master, "INFO", "replication")["connected_slaves"])
		return n > 0
	})
	return r
}

// waitLinkUp waits until the replica r's link to its master is up.
func waitLinkUp(t testing.TB, r *Server) {
	t.Helper()
	waitFor(t, "replica link up", func() bool {
		return infoOf(r, "INFO", "replication")["master_link_status"] == "up"
	})
}

// Cluster is a Redis Cluster of masters without replicas.
type Cluster struct {
	Nodes []*Server
}

// Addrs returns the addresses of the cluster's nodes.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// StartCluster starts a Redis Cluster of the given number of masters (at
// least 3) with no replicas, creates it with redis-cli and waits until every
// node reports cluster_state:ok. The nodes are stopped when t ends.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	return startCluster(t, masters, 0)
}

// startCluster starts a Cluster of masters, each with replicas replicas,
// and waits until every node serves the full slot map and knows every
// other node.
func startCluster(t testing.TB, masters, replicas int) *Cluster {
	t.Helper()
	need(t, "install redis-server/redis-tools", "redis-server", "redis-cli")
	if masters < 3 {
		t.Fatalf("redistest: a cluster needs at least 3 masters, got %d", masters)
	}
	c := &Cluster{}
	for i := 0; i < masters*(1+replicas); i++ {
		c.Nodes = append(c.Nodes, startClusterNode(t))
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, n := range c.Nodes {
		waitFor(t, "full slot map on "+n.Addr(), func() bool {
			info := infoOf(n, "CLUSTER", "INFO")
			return info["cluster_state"] == "ok" && info["cluster_slots_ok"] == "16384" &&
				info["cluster_known_nodes"] == strconv.Itoa(len(c.Nodes))
		})
	}
	return c
}

func startClusterNode(t testing.TB) *Server {
	t.Helper()
	dir := t.TempDir()
	s, err := launch(dir, true, nil, dataArgs(dir, []string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", "3000",
	})...)
	return own(t, "cluster node", s, err)
}

// Sentinel is a master, one replica and one sentinel monitoring them with
// quorum 1.
type Sentinel struct {
	// MasterName is the name the sentinel monitors the master under.
	MasterName string
	// Master and Replica are the data nodes as started; after a failover
	// their roles are swapped.
	Master, Replica *Server
	// Sentinel is the sentinel process.
	Sentinel *Server
}

// SentinelAddrs returns the sentinel addresses, for redis.FailoverOptions.
func (s *Sentinel) SentinelAddrs() []string { return []string{s.Sentinel.Addr()} }

// StartSentinel starts a master, a replica and a sentinel (quorum 1, down
// after 1s) and waits until the sentinel knows the replica, so a failover
// can be requested right away.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	m := Start(t)
	r := StartReplica(t, m)
	const name = "idemmaster"
	return &Sentinel{MasterName: name, Master: m, Replica: r, Sentinel: StartSentinelOf(t, name, m.Addr(), r.Port())}
}

// StartSentinelOf starts a sentinel that monitors the master at masterAddr
// under name, with quorum 1, down after 1s, and returns once it knows a
// replica listening on replicaPort. masterAddr may be a proxy in front of
// the master: the sentinel reaches the master only through it (it learns
// the replica's own address from the master's INFO). The sentinel is
// stopped when t ends.
func StartSentinelOf(t testing.TB, name, masterAddr string, replicaPort int) *Server {
	t.Helper()
	need(t, "install redis-server/redis-tools", "redis-server")
	host, port, err := net.SplitHostPort(masterAddr)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	body := fmt.Sprintf(`bind 127.0.0.1
dir %[1]s
sentinel monitor %[2]s %[3]s %[4]s 1
sentinel down-after-milliseconds %[2]s 1000
sentinel failover-timeout %[2]s 10000
sentinel parallel-syncs %[2]s 1
`, dir, name, host, port)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	s, err := launch(dir, false, nil, conf, "--sentinel")
	s = own(t, "sentinel", s, err)
	waitFor(t, "sentinel knows the replica", func() bool {
		reply, err := Do(s.Addr(), "SENTINEL", "REPLICAS", name)
		return err == nil && strings.Contains(reply, strconv.Itoa(replicaPort)) &&
			!strings.Contains(reply, "s_down") && !strings.Contains(reply, "disconnected")
	})
	return s
}

// MasterAddr asks the sentinel for the current master's address.
func (s *Sentinel) MasterAddr() (string, error) {
	reply, err := Do(s.Sentinel.Addr(), "SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.MasterName)
	if err != nil {
		return "", err
	}
	parts := strings.Fields(reply)
	if len(parts) != 2 {
		return "", fmt.Errorf("unexpected reply %q", reply)
	}
	return net.JoinHostPort(parts[0], parts[1]), nil
}

// waitFor polls cond until it holds, failing t after startTimeout.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	if !WaitFor(startTimeout, cond) {
		t.Fatalf("redistest: timed out waiting for %s", what)
	}
}

// WaitFor polls cond every 10ms until it holds or timeout passes, and
// reports whether it held.
func WaitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// freePort returns a loopback TCP port that is free right now. With bus
// set, port+10000 (the Cluster bus port) is free as well.
func freePort(bus bool) (int, error) {
	for i := 0; i < 200; i++ {
		port := 20000 + rand.IntN(20000)
		if portFree(port) && (!bus || portFree(port+10000)) {
			return port, nil
		}
	}
	return 0, errors.New("no free loopback port found")
}

func portFree(port int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// Do sends one command to the Redis server at addr over a fresh connection
// and returns its reply flattened to text: simple and bulk strings as they
// are, integers in decimal, a nil reply as "", arrays as their elements
// joined by newlines. A Redis error reply is returned as an error.
func Do(addr string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	// Dialled here, a server that is down is Do's error rather than a line
	// that go-redis logs.
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	c := redis.NewClient(&redis.Options{
		Addr:            addr,
		Dialer:          func(context.Context, string, string) (net.Conn, error) { return conn, nil },
		Protocol:        2, // arrays, not RESP3 maps, so that replies flatten in order
		DisableIdentity: true,
		MaxRetries:      -1,
		PoolSize:        1,
		ReadTimeout:     2 * time.Second,
		WriteTimeout:    2 * time.Second,
	})
	defer c.Close()
	cmd := make([]any, len(args))
	for i, a := range args {
		cmd[i] = a
	}
	reply, err := c.Do(ctx, cmd...).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	var out []string
	if err := flatten(reply, &out); err != nil {
		return "", err
	}
	return strings.Join(out, "\n"), nil
}

// flatten appends the text of reply, as Do returns it, to out.
func flatten(reply any, out *[]string) error {
	switch r := reply.(type) {
	case nil:
		*out = append(*out, "")
	case string:
		*out = append(*out, r)
	case int64:
		*out = append(*out, strconv.FormatInt(r, 10))
	case []any:
		for _, e := range r {
			if err := flatten(e, out); err != nil {
				return err
			}
		}
	case error: // an element of an array, such as a command's in EXEC
		return r
	default:
		return fmt.Errorf("unexpected reply %#v", reply)
	}
	return nil
}

// InfoField returns the value of name in the reply of INFO (or CLUSTER
// INFO), or "" when it is absent.
func InfoField(info, name string) string { return infoFields(info)[name] }

// infoFields returns the "name:value" lines of an INFO-style reply by name.
func infoFields(reply string) map[string]string {
	fields := map[string]string{}
	for line := range strings.Lines(reply) {
		if name, value, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[name] = value
		}
	}
	return fields
}

// infoOf runs an INFO-style command (INFO replication, CLUSTER INFO) on s and
// returns its fields; none when s does not answer.
func infoOf(s *Server, args ...string) map[string]string {
	reply, _ := Do(s.Addr(), args...)
	return infoFields(reply)
}

// CommandCalls returns how many times the server at addr has run command
// (its name as INFO commandstats spells it: "pttl", "cluster|slots"),
// calls from scripts included; 0 before the first. It fails t when the
// server cannot be asked.
func CommandCalls(t testing.TB, addr, command string) int {
	t.Helper()
	info, err := Do(addr, "INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	stat := InfoField(info, "cmdstat_"+command) // calls=N,usec=...
	calls, _, _ := strings.Cut(strings.TrimPrefix(stat, "calls="), ",")
	if calls == "" {
		return 0
	}
	n, err := strconv.Atoi(calls)
	if err != nil {
		t.Fatalf("redistest: %s: %s", command, stat)
	}
	return n
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
