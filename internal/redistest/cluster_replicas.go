package redistest

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/internal/clusternodes"
)

// topologyTimeout bounds how long the Cluster helpers wait for the nodes to
// agree on a change: a failover or a slot moving to another master.
const topologyTimeout = 30 * time.Second

// StartClusterWithReplicas starts a Redis Cluster of the given number of
// masters (at least 3), each with one replica, creates it with redis-cli
// and waits until every node reports cluster_state:ok, knows every other
// node, and every replica's link to its master is up. The nodes are stopped
// when t ends. Which servers become masters is redis-cli's choice: find a
// slot's master with MasterOf and its replica with ReplicaOf.
//
// The nodes run with cluster-node-timeout 3000, so a replica takes over
// from a master that stopped answering after about 4 seconds.
func StartClusterWithReplicas(t testing.TB, masters int) *Cluster {
	t.Helper()
	c := startCluster(t, masters, 1)
	for _, n := range c.Nodes {
		waitFor(t, "a settled role on "+n.Addr(), func() bool {
			info := infoOf(n, "INFO", "replication")
			switch info["role"] {
			case "master":
				return info["connected_slaves"] == "1"
			case "slave":
				return info["master_link_status"] == "up"
			}
			return false
		})
	}
	for _, n := range c.Nodes {
		waitFor(t, "every role known to "+n.Addr(), func() bool {
			return c.count(n, func(v ClusterNode) bool { return !v.Master && v.MasterID != "" && !v.Failed }) == masters
		})
	}
	return c
}

// ClusterNode is a node of a Cluster as one member sees it: a line of
// CLUSTER NODES.
type ClusterNode = clusternodes.Node

// View returns the Cluster's nodes as the node s sees them.
func (c *Cluster) View(s *Server) ([]ClusterNode, error) {
	text, err := Do(s.Addr(), "CLUSTER", "NODES")
	if err != nil {
		return nil, err
	}
	return clusternodes.Parse(text)
}

// count returns how many nodes that s sees match, or -1 when s does not
// answer.
func (c *Cluster) count(s *Server, match func(ClusterNode) bool) int {
	view, err := c.View(s)
	if err != nil {
		return -1
	}
	n := 0
	for _, v := range view {
		if match(v) {
			n++
		}
	}
	return n
}

// Live returns the nodes that are running.
func (c *Cluster) Live() []*Server {
	var live []*Server
	for _, n := range c.Nodes {
		if n.PID() != 0 {
			live = append(live, n)
		}
	}
	return live
}

// Node returns the node listening on addr, or nil.
func (c *Cluster) Node(addr string) *Server {
	for _, n := range c.Nodes {
		if n.Addr() == addr {
			return n
		}
	}
	return nil
}

// ID returns the cluster node ID of s.
func (c *Cluster) ID(t testing.TB, s *Server) string {
	t.Helper()
	return must(t, s, "CLUSTER", "MYID")
}

// must sends a command to s with Do and returns its reply, failing t when
// it fails.
func must(t testing.TB, s *Server, args ...string) string {
	t.Helper()
	reply, err := Do(s.Addr(), args...)
	if err != nil {
		t.Fatalf("redistest: %s on %s: %v", strings.Join(args, " "), s.Addr(), err)
	}
	return reply
}

// KeySlot returns the hash slot of key.
func (c *Cluster) KeySlot(t testing.TB, key string) int {
	t.Helper()
	var lastErr error
	for _, n := range c.Live() {
		reply, err := Do(n.Addr(), "CLUSTER", "KEYSLOT", key)
		if err == nil {
			slot, err := strconv.Atoi(reply)
			if err == nil {
				return slot
			}
		}
		lastErr = err
	}
	t.Fatalf("redistest: CLUSTER KEYSLOT: %v", lastErr)
	return 0
}

// owner returns the address of the master that every running node sees
// serving slot, or an error saying why there is none yet.
func (c *Cluster) owner(slot int) (string, error) {
	owner := ""
	for _, n := range c.Live() {
		view, err := c.View(n)
		if err != nil {
			return "", err
		}
		seen := ""
		for _, v := range view {
			if v.Master && !v.Failed && v.Serves(slot) {
				seen = v.Addr
			}
		}
		switch {
		case seen == "":
			return "", fmt.Errorf("%s sees no master serving slot %d", n.Addr(), slot)
		case owner == "":
			owner = seen
		case seen != owner:
			return "", fmt.Errorf("nodes disagree on slot %d: %s and %s", slot, owner, seen)
		}
	}
	if owner == "" {
		return "", errors.New("no node is running")
	}
	return owner, nil
}

// MasterOf returns the master serving slot, once every running node agrees
// on it.
func (c *Cluster) MasterOf(t testing.TB, slot int) *Server {
	t.Helper()
	return c.WaitMasterOf(t, slot, nil, topologyTimeout)
}

// ReplicaOf returns the running replica of master, as master sees it.
func (c *Cluster) ReplicaOf(t testing.TB, master *Server) *Server {
	t.Helper()
	replicas, err := c.Replicas(master)
	if err != nil {
		t.Fatalf("redistest: replicas of %s: %v", master.Addr(), err)
	}
	if len(replicas) == 0 {
		t.Fatalf("redistest: %s has no running replica", master.Addr())
	}
	return replicas[0]
}

// Replicas returns the running replicas of master, as master sees them.
func (c *Cluster) Replicas(master *Server) ([]*Server, error) {
	id, err := Do(master.Addr(), "CLUSTER", "MYID")
	if err != nil {
		return nil, err
	}
	view, err := c.View(master)
	if err != nil {
		return nil, err
	}
	var replicas []*Server
	for _, v := range view {
		if v.MasterID == id && !v.Failed {
			if s := c.Node(v.Addr); s != nil && s.PID() != 0 {
				replicas = append(replicas, s)
			}
		}
	}
	return replicas, nil
}

// WaitMasterOf waits until every running node agrees that a master other
// than old (any, when old is nil) serves slot (after old failed, its replica
// takes over), and returns it. It fails t after timeout.
func (c *Cluster) WaitMasterOf(t testing.TB, slot int, old *Server, timeout time.Duration) *Server {
	t.Helper()
	var addr string
	var err error
	if !WaitFor(timeout, func() bool {
		addr, err = c.owner(slot)
		if err == nil && old != nil && addr == old.Addr() {
			err = fmt.Errorf("slot %d still served by %s", slot, addr)
		}
		return err == nil
	}) {
		t.Fatalf("redistest: master of slot %d: %v", slot, err)
	}
	s := c.Node(addr)
	if s == nil {
		t.Fatalf("redistest: slot %d served by %s, which is not a node of the cluster", slot, addr)
	}
	return s
}

// BeginSlotMigration marks slot as importing on to and migrating on from,
// the first step of moving it: from then answers ASK, pointing to to, for
// the keys of the slot it no longer holds.
func (c *Cluster) BeginSlotMigration(t testing.TB, slot int, from, to *Server) {
	t.Helper()
	must(t, to, "CLUSTER", "SETSLOT", strconv.Itoa(slot), "IMPORTING", c.ID(t, from))
	must(t, from, "CLUSTER", "SETSLOT", strconv.Itoa(slot), "MIGRATING", c.ID(t, to))
}

// MigrateSlotKeys moves every key of slot from from to to with MIGRATE.
func (c *Cluster) MigrateSlotKeys(t testing.TB, slot int, from, to *Server) {
	t.Helper()
	for {
		keys := must(t, from, "CLUSTER", "GETKEYSINSLOT", strconv.Itoa(slot), "100")
		if keys == "" {
			return
		}
		args := []string{"MIGRATE", "127.0.0.1", strconv.Itoa(to.Port()), "", "0", "5000", "KEYS"}
		must(t, from, append(args, strings.Split(keys, "\n")...)...)
	}
}

// FinishSlotMigration assigns slot to to on every running master, to
// first, and waits until every running node agrees. from then answers
// MOVED for the slot's keys.
func (c *Cluster) FinishSlotMigration(t testing.TB, slot int, to *Server) {
	t.Helper()
	toID := c.ID(t, to)
	masters := []*Server{to}
	for _, n := range c.Live() {
		if n != to && infoOf(n, "INFO", "replication")["role"] == "master" {
			masters = append(masters, n)
		}
	}
	for _, m := range masters {
		must(t, m, "CLUSTER", "SETSLOT", strconv.Itoa(slot), "NODE", toID)
	}
	if got := c.MasterOf(t, slot); got != to {
		t.Fatalf("redistest: slot %d served by %s after migrating it to %s", slot, got.Addr(), to.Addr())
	}
}

// MigrateSlot moves slot and its keys from from to to: BeginSlotMigration,
// MigrateSlotKeys and FinishSlotMigration.
func (c *Cluster) MigrateSlot(t testing.TB, slot int, from, to *Server) {
	t.Helper()
	c.BeginSlotMigration(t, slot, from, to)
	c.MigrateSlotKeys(t, slot, from, to)
	c.FinishSlotMigration(t, slot, to)
}

// OtherMaster returns a running master other than m: one with a running
// replica when there is one.
func (c *Cluster) OtherMaster(t testing.TB, m *Server) *Server {
	t.Helper()
	var other *Server
	for _, n := range c.Live() {
		if n == m || infoOf(n, "INFO", "replication")["role"] != "master" {
			continue
		}
		if r, err := c.Replicas(n); err == nil && len(r) > 0 {
			return n
		}
		other = n
	}
	if other == nil {
		t.Fatalf("redistest: no running master other than %s", m.Addr())
	}
	return other
}

// Failover makes master's replica take over with CLUSTER FAILOVER (a
// manual failover: the two agree, no write is lost) and waits until the
// roles have swapped: the old master replicates from the new one, and every
// running node sees the new master serve slot (one of master's slots) and
// the old master as its replica. It returns the new master.
func (c *Cluster) Failover(t testing.TB, master *Server, slot int) *Server {
	t.Helper()
	replica := c.ReplicaOf(t, master)
	newID := c.ID(t, replica)
	must(t, replica, "CLUSTER", "FAILOVER")
	var why string
	if !WaitFor(topologyTimeout, func() bool {
		info := infoOf(master, "INFO", "replication")
		if info["role"] != "slave" || info["master_link_status"] != "up" || info["master_port"] != strconv.Itoa(replica.Port()) {
			why = "the old master does not replicate from the new one"
			return false
		}
		owner, err := c.owner(slot)
		if err != nil || owner != replica.Addr() {
			why = fmt.Sprintf("slot %d: %s %v", slot, owner, err)
			return false
		}
		for _, n := range c.Live() {
			if c.count(n, func(v ClusterNode) bool { return v.Addr == master.Addr() && v.MasterID != newID }) != 0 {
				why = n.Addr() + " does not see the old master as a replica yet"
				return false
			}
		}
		return true
	}) {
		t.Fatalf("redistest: failover of %s to %s: %s", master.Addr(), replica.Addr(), why)
	}
	return replica
}

// AddMaster starts a node, joins it to the Cluster as a master serving no
// slot (CLUSTER MEET), adds it to Nodes and waits until every running node
// knows every other. Move slots to it with MigrateSlot. The node is
// stopped when t ends: pass the test that owns the Cluster.
func (c *Cluster) AddMaster(t testing.TB) *Server {
	t.Helper()
	live := c.Live()
	if len(live) == 0 {
		t.Fatal("redistest: AddMaster: no node is running")
	}
	n := startClusterNode(t)
	must(t, live[0], "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(n.Port()))
	c.Nodes = append(c.Nodes, n)
	waitFor(t, "full slot map on "+n.Addr(), func() bool {
		info := infoOf(n, "CLUSTER", "INFO")
		return info["cluster_state"] == "ok" && info["cluster_slots_ok"] == "16384"
	})
	for _, m := range c.Live() {
		waitFor(t, m.Addr()+" knowing every node", func() bool {
			return c.count(m, func(v ClusterNode) bool {
				// A node still in handshake has neither role yet.
				known := c.Node(v.Addr)
				return (v.Master || v.MasterID != "") && !v.Failed && known != nil && known.PID() != 0
			}) == len(c.Live())
		})
	}
	return n
}
