package rabbittest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Node is a RabbitMQ node of the test binary's own, for the tests that
// stop the broker: the broker a developer runs for their own work is
// never stopped or reconfigured by a test. The node has a name of its own
// (rabbit-test-<random>@localhost), its AMQP and distribution ports and
// an epmd of its own on free loopback ports, and its configuration, data
// and logs in a temporary directory that is removed with it. It is started
// from the scripts of a RabbitMQ installation (Debian's rabbitmq-server
// package: /usr/lib/rabbitmq/bin) at the first PrivateNode of the test
// binary, which takes a few seconds, and stopped by Main when the tests
// end. Guest connects from the loopback interface, as on a fresh broker.
type Node struct {
	name string // the Erlang node name
	url  string
	dir  string   // its temporary directory
	env  []string // of the node and of rabbitmqctl
	ctl  string   // rabbitmqctl

	server, epmd *exec.Cmd
	exited       chan struct{} // closed when server has exited
	startedIn    time.Duration

	mu      sync.Mutex
	stopped bool // its application stopped by Stop
}

// startTimeout bounds the node's start, from its scripts to the AMQP port
// answering: about 7s on two idle cores, more under load.
const startTimeout = 2 * time.Minute

var private struct {
	main bool // Main runs the tests
	once sync.Once
	node *Node
	err  error
}

// Main runs the tests of m and then stops the private node, if a test
// started one, and removes its directory. A test package that calls
// PrivateNode calls it from its TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(rabbittest.Main(m)) }
func Main(m *testing.M) int {
	private.main = true
	code := m.Run()
	if n := private.node; n != nil {
		if err := n.shutdown(); err != nil {
			fmt.Fprintf(os.Stderr, "rabbittest: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

// PrivateNode returns the test binary's private node, started at the
// first call, with its application running. When t ends, the node's
// application is started again if t left it stopped. Without a RabbitMQ
// installation t is skipped, or failed under RequireEnv=1; a node that
// does not start fails t. It needs Main in the package's TestMain, which
// stops the node.
func PrivateNode(t testing.TB) *Node {
	t.Helper()
	if !private.main {
		t.Fatal("rabbittest: PrivateNode needs rabbittest.Main in TestMain, which stops the node when the tests end")
	}
	server, ctl, epmd, missing := installation()
	if missing != "" {
		msg := "a private RabbitMQ node needs " + missing + " (Debian's rabbitmq-server package)"
		if os.Getenv(RequireEnv) == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	private.once.Do(func() { private.node, private.err = startNode(server, ctl, epmd) })
	if private.err != nil {
		t.Fatalf("rabbittest: %v", private.err)
	}
	n := private.node
	t.Logf("rabbittest: private node %s on %s, started in %v", n.name, n.url, n.startedIn.Round(time.Millisecond))
	t.Cleanup(func() {
		if err := n.ensureRunning(); err != nil {
			t.Errorf("rabbittest: %v", err)
		}
	})
	return n
}

// installation finds the scripts a private node needs: rabbitmq-server
// and rabbitmqctl, run directly rather than through Debian's wrappers in
// /usr/sbin (which switch to the rabbitmq user and its home), and epmd.
// missing names what is not there.
func installation() (server, ctl, epmd, missing string) {
	find := func(name string, dirs ...string) string {
		for _, d := range dirs {
			p := filepath.Join(d, name)
			if st, err := os.Stat(p); err == nil && !st.IsDir() {
				return p
			}
		}
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
		return ""
	}
	server = find("rabbitmq-server", "/usr/lib/rabbitmq/bin")
	ctl = find("rabbitmqctl", "/usr/lib/rabbitmq/bin")
	epmd = find("epmd", "/usr/lib/erlang/bin")
	var lack []string
	for name, p := range map[string]string{"rabbitmq-server": server, "rabbitmqctl": ctl, "epmd": epmd} {
		if p == "" {
			lack = append(lack, name)
		}
	}
	return server, ctl, epmd, strings.Join(lack, " and ")
}

// startNode starts a private node and returns once it accepts AMQP
// connections. On an error, what it started is stopped.
func startNode(server, ctl, epmd string) (n *Node, err error) {
	begin := time.Now()
	dir, err := os.MkdirTemp("", "rabbit-test-")
	if err != nil {
		return nil, err
	}
	var b [4]byte
	rand.Read(b[:])
	n = &Node{name: "rabbit-test-" + hex.EncodeToString(b[:]) + "@localhost", dir: dir, ctl: ctl, exited: make(chan struct{})}
	defer func() {
		if err != nil {
			err = fmt.Errorf("private node %s: %w%s", n.name, err, n.logTail())
			if serr := n.shutdown(); serr != nil {
				err = fmt.Errorf("%w; %v", err, serr)
			}
			n = nil
		}
	}()
	ports, err := freePorts(3)
	if err != nil {
		return n, err
	}
	amqpPort, distPort, epmdPort := ports[0], ports[1], ports[2]
	n.url = fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", amqpPort)

	files := map[string]string{
		// Read instead of /etc/rabbitmq/rabbitmq-env.conf, which names the
		// machine's broker.
		"rabbitmq-env.conf": "",
		"rabbitmq.conf":     "# a private node of the tests\n",
		"enabled_plugins":   "[].\n",
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			return n, err
		}
	}
	for _, sub := range []string{"home", "mnesia", "log"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
			return n, err
		}
	}
	n.env = append(cleanEnv(),
		// The Erlang cookie, shared by the node and rabbitmqctl, is
		// created in HOME.
		"HOME="+filepath.Join(dir, "home"),
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(dir, "rabbitmq-env.conf"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq.conf"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(dir, "advanced.config"), // none
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_PID_FILE="+filepath.Join(dir, "rabbitmq.pid"),
		"RABBITMQ_NODENAME="+n.name,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(amqpPort),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(distPort),
		"ERL_EPMD_ADDRESS=127.0.0.1",
		"ERL_EPMD_PORT="+strconv.Itoa(epmdPort),
	)

	// An epmd of the node's own, in the foreground, so that it is stopped
	// by its PID: the node would otherwise start one as a daemon, which
	// outlives it, or register with the machine's.
	n.epmd = exec.Command(epmd, "-port", strconv.Itoa(epmdPort))
	n.epmd.Env, n.epmd.SysProcAttr = n.env, childAttr()
	if err := n.epmd.Start(); err != nil {
		return n, fmt.Errorf("epmd: %w", err)
	}
	if err := waitListening(epmdPort, 10*time.Second); err != nil {
		return n, fmt.Errorf("epmd: %w", err)
	}

	out, err := os.Create(filepath.Join(dir, "server.out"))
	if err != nil {
		return n, err
	}
	defer out.Close()
	n.server = exec.Command(server)
	n.server.Dir = dir
	n.server.Env, n.server.SysProcAttr = n.env, childAttr()
	n.server.Stdout, n.server.Stderr = out, out
	if err := n.server.Start(); err != nil {
		return n, fmt.Errorf("rabbitmq-server: %w", err)
	}
	go func() {
		_ = n.server.Wait()
		close(n.exited)
	}()
	if err := n.awaitAMQP(startTimeout); err != nil {
		return n, err
	}
	n.startedIn = time.Since(begin)
	return n, nil
}

// cleanEnv is the test's environment without the variables that would
// point the node or rabbitmqctl elsewhere.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RABBITMQ_") && !strings.HasPrefix(kv, "ERL_") && !strings.HasPrefix(kv, "HOME=") {
			env = append(env, kv)
		}
	}
	return env
}

// freePorts returns n distinct free TCP ports on 127.0.0.1.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer ln.Close() // held until all are chosen, so that they differ
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// waitListening waits up to d for 127.0.0.1:port to accept connections.
func waitListening(port int, d time.Duration) error {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for deadline := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) { // nothing to wait on but the port
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nothing listens on %s after %v", addr, d)
		}
	}
}

// awaitAMQP waits up to d for the node to accept an AMQP connection,
// failing early when its server exits.
func (n *Node) awaitAMQP(d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		conn, err := amqp.DialConfig(n.url, amqp.Config{Dial: amqp.DefaultDial(time.Second)})
		if err == nil {
			conn.Close()
			return nil
		}
		select {
		case <-n.exited:
			return fmt.Errorf("rabbitmq-server exited while starting: %v", n.server.ProcessState)
		case <-time.After(100 * time.Millisecond): // the boot has no signal to wait on
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no AMQP connection after %v: %w", d, err)
		}
	}
}

// logTail returns the last lines of the node's output and log, for an
// error.
func (n *Node) logTail() string {
	var b strings.Builder
	logs, _ := filepath.Glob(filepath.Join(n.dir, "log", "*.log"))
	for _, f := range append([]string{filepath.Join(n.dir, "server.out")}, logs...) {
		text, err := os.ReadFile(f)
		if err != nil || len(text) == 0 {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(text)), "\n")
		fmt.Fprintf(&b, "\n--- %s:\n%s", filepath.Base(f), strings.Join(lines[max(0, len(lines)-20):], "\n"))
	}
	return b.String()
}

// URL returns the node's AMQP URL (guest, on 127.0.0.1).
func (n *Node) URL() string { return n.url }

// Name returns the node's name, as rabbitmqctl -n takes it.
func (n *Node) Name() string { return n.name }

// Dial returns a connection to the node, closed when t ends.
func (n *Node) Dial(t testing.TB) *amqp.Connection {
	t.Helper()
	return dial(t, n.url)
}

// Channel returns a channel on a connection of its own to the node,
// closed when t ends.
func (n *Node) Channel(t testing.TB) *amqp.Channel {
	t.Helper()
	return channel(t, n.url)
}

// Queue declares a queue of t's own on the node, as the package's Queue
// does on the shared broker, and deletes it when t ends, once the node's
// application is running again if t stopped it.
func (n *Node) Queue(t testing.TB) string {
	t.Helper()
	return queue(t, n.url, n.ensureRunning)
}

// Stop stops the node's application (rabbitmqctl stop_app on the node's
// name): every connection is closed; durable queues and persistent
// messages are kept; the node stays up.
func (n *Node) Stop() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.stopped = true
	return n.ctlRun("stop_app")
}

// Start starts the node's application again and returns once it accepts
// connections.
func (n *Node) Start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.ctlRun("start_app"); err != nil {
		return err
	}
	if err := n.ctlRun("await_startup"); err != nil {
		return err
	}
	n.stopped = false
	return nil
}

// ensureRunning starts the node's application if Stop left it stopped.
func (n *Node) ensureRunning() error {
	n.mu.Lock()
	stopped := n.stopped
	n.mu.Unlock()
	if !stopped {
		return nil
	}
	return n.Start()
}

// ctlRun runs rabbitmqctl on the node.
func (n *Node) ctlRun(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, n.ctl, append([]string{"-n", n.name, "-q"}, args...)...)
	cmd.Env = n.env
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("rabbitmqctl -n %s %s: %v: %s", n.name, strings.Join(args, " "), err, out)
	}
	return nil
}

// stopTimeout bounds the node's orderly stop; then it is killed.
const stopTimeout = 30 * time.Second

// shutdown stops the node's server (SIGTERM to the script, which stops
// the VM and waits for it), then its epmd, each by PID, and removes its
// directory. What does not stop within stopTimeout is killed, with its
// process group.
func (n *Node) shutdown() error {
	var errs []error
	if n.server != nil && n.server.Process != nil {
		_ = terminate(n.server.Process)
		select {
		case <-n.exited:
		case <-time.After(stopTimeout):
			killGroup(n.server.Process)
			<-n.exited
			errs = append(errs, fmt.Errorf("private node %s still running %v after SIGTERM: killed", n.name, stopTimeout))
		}
	}
	if n.epmd != nil && n.epmd.Process != nil {
		_ = terminate(n.epmd.Process)
		done := make(chan struct{})
		go func() {
			_ = n.epmd.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(stopTimeout):
			killGroup(n.epmd.Process)
			<-done
		}
	}
	if err := os.RemoveAll(n.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
