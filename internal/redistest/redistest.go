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
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
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
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return "idemtest:" + hex.EncodeToString(b[:]) + ":"
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
	args []string // arguments after the port and directory

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited and been reaped
	log    string
}

// Start starts a private redis-server for t with the extra configuration
// arguments given (each "--name value" pair as separate strings) and returns
// once it answers PING. The server is stopped when t ends. It never uses
// REDIS_ADDR.
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	need(t, "install redis-server/redis-tools or set REDIS_ADDR", "redis-server")
	s, err := Launch(t.TempDir(), args...)
	if err != nil {
		t.Fatalf("redistest: starting redis-server: %v", err)
	}
	s.t = t
	t.Cleanup(s.Stop)
	return s
}

// Launch starts redis-server (found on PATH) on a free loopback port with
// its files in dir and the extra configuration arguments given, and returns
// once it answers PING. It is Start for programs that run outside a test,
// such as a load command: the caller stops the server with Stop.
func Launch(dir string, args ...string) (*Server, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, fmt.Errorf("redistest: redis-server not found on PATH: %w", err)
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort(false)
		if err != nil {
			return nil, err
		}
		s := &Server{port: port, dir: dir, args: args}
		if lastErr = s.start(); lastErr == nil {
			return s, nil
		}
	}
	return nil, lastErr
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

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("already running")
	}
	args := []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--repl-diskless-sync-delay", "0",
	}
	args = append(args, s.args...)
	return s.startLocked(exec.Command("redis-server", args...))
}

func (s *Server) startLocked(cmd *exec.Cmd) error {
	logPath := filepath.Join(s.dir, "redis.log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Dir = s.dir
	if err := cmd.Start(); err != nil {
		f.Close()
		return err
	}
	f.Close()
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.cmd, s.exited, s.log = cmd, exited, logPath
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
			s.stopLocked()
			return fmt.Errorf("redis-server on port %d did not answer PING within %v", s.port, startTimeout)
		}
	}
}

// Stop stops the server by its PID and waits for it to exit. Stopping a
// stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked()
}

func (s *Server) stopLocked() {
	if s.cmd == nil {
		return
	}
	p, exited := s.cmd.Process, s.exited
	s.cmd = nil
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		_ = p.Kill()
		<-exited
	}
}

// Restart stops the server and starts it again on the same port with the
// same configuration (servers made by Start only). Data is not kept: the new process starts empty, with
// an empty script cache.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond) // the port may linger briefly
	}
	s.t.Fatalf("redistest: restarting redis-server: %v", err)
}

// StartReplica starts a private redis-server replicating master and waits
// until the replication link is up.
func StartReplica(t testing.TB, master *Server, args ...string) *Server {
	t.Helper()
	args = append([]string{"--replicaof", "127.0.0.1", strconv.Itoa(master.Port())}, args...)
	r := Start(t, args...)
	waitFor(t, "replica link up", func() bool {
		info, err := Do(r.Addr(), "INFO", "replication")
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	waitFor(t, "master sees its replica", func() bool {
		info, err := Do(master.Addr(), "INFO", "replication")
		return err == nil && infoField(info, "connected_slaves") != "0" && infoField(info, "connected_slaves") != ""
	})
	return r
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
	need(t, "install redis-server/redis-tools", "redis-server", "redis-cli")
	if masters < 3 {
		t.Fatalf("redistest: a cluster needs at least 3 masters, got %d", masters)
	}
	c := &Cluster{}
	for i := 0; i < masters; i++ {
		c.Nodes = append(c.Nodes, startClusterNode(t))
	}
	args := append(c.Addrs(), "--cluster-replicas", "0", "--cluster-yes")
	cmd := exec.Command("redis-cli", append([]string{"--cluster", "create"}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, n := range c.Nodes {
		waitFor(t, "cluster_state:ok on "+n.Addr(), func() bool {
			info, err := Do(n.Addr(), "CLUSTER", "INFO")
			return err == nil && infoField(info, "cluster_state") == "ok"
		})
	}
	// Every node must know every other node's slots before clients are
	// pointed at it.
	for _, n := range c.Nodes {
		waitFor(t, "full slot map on "+n.Addr(), func() bool {
			info, err := Do(n.Addr(), "CLUSTER", "INFO")
			return err == nil && infoField(info, "cluster_slots_ok") == "16384" &&
				infoField(info, "cluster_known_nodes") == strconv.Itoa(masters)
		})
	}
	return c
}

func startClusterNode(t testing.TB) *Server {
	t.Helper()
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort(true)
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		s := &Server{t: t, port: port, dir: t.TempDir(), args: []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "3000",
		}}
		if lastErr = s.start(); lastErr == nil {
			t.Cleanup(s.Stop)
			return s
		}
	}
	t.Fatalf("redistest: starting cluster node: %v", lastErr)
	return nil
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
	need(t, "install redis-server/redis-tools", "redis-server")
	m := Start(t)
	r := StartReplica(t, m)
	st := &Sentinel{MasterName: "idemmaster", Master: m, Replica: r}

	var lastErr error
	for attempt := 0; attempt < 5 && st.Sentinel == nil; attempt++ {
		port, err := freePort(false)
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		s := &Server{t: t, port: port, dir: t.TempDir()}
		conf := filepath.Join(s.dir, "sentinel.conf")
		body := fmt.Sprintf(`port %d
bind 127.0.0.1
dir %s
sentinel monitor %s 127.0.0.1 %d 1
sentinel down-after-milliseconds %s 1000
sentinel failover-timeout %s 10000
sentinel parallel-syncs %s 1
`, port, s.dir, st.MasterName, m.Port(), st.MasterName, st.MasterName, st.MasterName)
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			t.Fatalf("redistest: %v", err)
		}
		s.mu.Lock()
		lastErr = s.startLocked(exec.Command("redis-server", conf, "--sentinel"))
		s.mu.Unlock()
		if lastErr == nil {
			t.Cleanup(s.Stop)
			st.Sentinel = s
		}
	}
	if st.Sentinel == nil {
		t.Fatalf("redistest: starting sentinel: %v", lastErr)
	}
	waitFor(t, "sentinel knows the replica", func() bool {
		reply, err := Do(st.Sentinel.Addr(), "SENTINEL", "REPLICAS", st.MasterName)
		return err == nil && strings.Contains(reply, strconv.Itoa(r.Port())) &&
			!strings.Contains(reply, "s_down") && !strings.Contains(reply, "disconnected")
	})
	return st
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

// waitFor polls cond every 10ms until it holds, failing t after a deadline.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(startTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("redistest: timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
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
		n, err := rand.Int(rand.Reader, big.NewInt(20000))
		if err != nil {
			return 0, err
		}
		port := 20000 + int(n.Int64())
		if !portFree(port) || (bus && !portFree(port+10000)) {
			continue
		}
		return port, nil
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

// infoField returns the value of name in an INFO-style "name:value" text.
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return v
		}
	}
	return ""
}

// InfoField returns the value of name in the reply of INFO (or CLUSTER
// INFO), or "" when it is absent.
func InfoField(info, name string) string { return infoField(info, name) }

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
	stat := infoField(info, "cmdstat_"+command) // calls=N,usec=...
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
