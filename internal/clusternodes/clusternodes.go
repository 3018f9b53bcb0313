// Package clusternodes reads the reply of Redis Cluster's CLUSTER NODES,
// for the server checks and the tests that start Clusters.
package clusternodes

import (
	"fmt"
	"strconv"
	"strings"
)

// Node is one line of CLUSTER NODES: a node as the member that answered
// sees it.
type Node struct {
	// ID is the node's ID and Addr its "host:port" (":port" for a node
	// that has not learnt its own address yet).
	ID, Addr string
	// Master is set for a master; MasterID is the ID of a replica's
	// master.
	Master   bool
	MasterID string
	// Failed is set when the member considers the node failing or not
	// yet a member: the flags fail, fail?, noaddr and handshake.
	Failed bool
	// Slots are the ranges of slots the node serves, ends included;
	// slots being migrated or imported are not listed.
	Slots [][2]int
}

// Serves reports whether n serves slot.
func (n Node) Serves(slot int) bool {
	for _, r := range n.Slots {
		if slot >= r[0] && slot <= r[1] {
			return true
		}
	}
	return false
}

// SlotCount returns the number of slots n serves.
func (n Node) SlotCount() int {
	c := 0
	for _, r := range n.Slots {
		c += r[1] - r[0] + 1
	}
	return c
}

// Parse parses the reply of CLUSTER NODES. A line it cannot read is an
// error.
func Parse(text string) ([]Node, error) {
	var nodes []Node
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			return nil, fmt.Errorf("clusternodes: line %q", line)
		}
		addr, _, _ := strings.Cut(f[1], "@")
		n := Node{ID: f[0], Addr: addr}
		for _, flag := range strings.Split(f[2], ",") {
			switch flag {
			case "master":
				n.Master = true
			case "fail", "fail?", "noaddr", "handshake":
				n.Failed = true
			}
		}
		if f[3] != "-" {
			n.MasterID = f[3]
		}
		for _, s := range f[8:] {
			if strings.HasPrefix(s, "[") { // a slot being migrated or imported
				continue
			}
			lo, hi, isRange := strings.Cut(s, "-")
			a, err := strconv.Atoi(lo)
			b := a
			if err == nil && isRange {
				b, err = strconv.Atoi(hi)
			}
			if err != nil || b < a {
				return nil, fmt.Errorf("clusternodes: slots %q in line %q", s, line)
			}
			n.Slots = append(n.Slots, [2]int{a, b})
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}
