package servercheck

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency/internal/clusternodes"
)

// clockSpreadLimit is the largest difference between the clocks of a
// Cluster's nodes judged OK: a tenth of the default lease.
const clockSpreadLimit = time.Second

// checkCluster checks every node that CLUSTER NODES lists (but those the
// Cluster marks as failed, which the layout findings report), and the
// layout the Cluster reports.
//
// Each node is read through a client of its own, made with the options of
// cc's node clients and closed at the end, not through ForEachShard: that
// would reload cc's slot map, a side effect a check must not have, and send
// the commands through cc's hooks.
func checkCluster(ctx context.Context, cc *redis.ClusterClient) (Report, error) {
	nodesText, err := cc.ClusterNodes(ctx).Result()
	if err != nil {
		return Report{}, fmt.Errorf("servercheck: CLUSTER NODES: %w", err)
	}
	stateText, err := cc.ClusterInfo(ctx).Result()
	if err != nil {
		return Report{}, fmt.Errorf("servercheck: CLUSTER INFO: %w", err)
	}
	listed, err := clusternodes.Parse(nodesText)
	if err != nil {
		return Report{}, fmt.Errorf("servercheck: %w", err)
	}
	layout := judgeLayout(parseInfo(stateText), listed)
	// The master of slot 0, or any node when slot 0 has none: the client
	// whose options the node clients copy.
	template, err := cc.MasterForKey(ctx, "")
	if err != nil {
		return Report{}, fmt.Errorf("servercheck: %w", err)
	}
	templateHost, _, _ := net.SplitHostPort(template.Options().Addr)

	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		nodes []nodeInfo
		down  []Finding
	)
	for _, ln := range listed {
		if ln.Failed {
			continue
		}
		addr := ln.Addr
		if port, ok := strings.CutPrefix(addr, ":"); ok { // a node that has not learnt its own address yet
			addr = net.JoinHostPort(templateHost, port)
		}
		wg.Go(func() {
			opt := *template.Options()
			opt.Addr, opt.NodeAddress = addr, addr
			c := redis.NewClient(&opt)
			defer c.Close()
			n, err := gather(ctx, c, addr)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				down = append(down, Finding{Item: "reachable", Node: addr, Verdict: Fail, Value: "no answer",
					Detail: "the node did not answer: " + err.Error()})
				return
			}
			nodes = append(nodes, n)
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return Report{}, fmt.Errorf("servercheck: %w", err)
	}
	slices.SortFunc(nodes, func(a, b nodeInfo) int { return strings.Compare(a.addr, b.addr) })

	findings := layout
	findings = append(findings, judgeClockSpread(nodes))
	var perNode []Finding
	for _, n := range nodes {
		perNode = append(perNode, judgeNode(n, cluster)...)
	}
	perNode = append(perNode, down...)
	slices.SortStableFunc(perNode, func(a, b Finding) int { return strings.Compare(a.Node, b.Node) })
	return Report{Findings: append(findings, perNode...)}, nil
}

// judgeClockSpread compares the clocks of a Cluster's nodes.
func judgeClockSpread(nodes []nodeInfo) Finding {
	f := Finding{Item: "clock-spread"}
	var lo, hi *nodeInfo
	for i := range nodes {
		n := &nodes[i]
		if n.clockErr != nil {
			continue
		}
		if lo == nil || n.offset < lo.offset {
			lo = n
		}
		if hi == nil || n.offset > hi.offset {
			hi = n
		}
	}
	if lo == nil {
		f.Verdict, f.Value, f.Detail = Info, "unknown", "no node answered TIME"
		return f
	}
	spread := (hi.offset - lo.offset).Round(time.Millisecond)
	f.Value = fmt.Sprintf("%v between %s and %s", spread, lo.addr, hi.addr)
	if spread > clockSpreadLimit {
		f.Verdict = Warn
		f.Detail = "after a failover or slot migration a lease is judged by another node's clock, and a clock ahead ends every inherited lease early (a lease survives a skew below a third of itself); run NTP on every node"
		return f
	}
	f.Verdict = OK
	f.Detail = fmt.Sprintf("within %v: leases survive failovers and slot migrations", clockSpreadLimit)
	return f
}

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// judgeLayout judges a Cluster's state, slot coverage and replicas.
func judgeLayout(info map[string]string, nodes []clusternodes.Node) []Finding {
	var out []Finding
	state := info["cluster_state"]
	if state == "ok" {
		out = append(out, Finding{Item: "cluster-state", Verdict: OK, Value: "ok", Detail: "the Cluster serves every slot"})
	} else {
		out = append(out, Finding{Item: "cluster-state", Verdict: Fail, Value: strconv.Quote(state),
			Detail: "the Cluster refuses commands (CLUSTERDOWN): every request gets 503"})
	}

	covered := 0
	replicas := map[string]int{}
	for _, n := range nodes {
		if n.Master && !n.Failed {
			covered += n.SlotCount()
		}
		if !n.Master && !n.Failed && n.MasterID != "" {
			replicas[n.MasterID]++
		}
	}
	if covered >= clusterSlots {
		out = append(out, Finding{Item: "cluster-slots", Verdict: OK, Value: fmt.Sprintf("%d of %d slots", covered, clusterSlots),
			Detail: "every slot has a live master"})
	} else {
		out = append(out, Finding{Item: "cluster-slots", Verdict: Fail, Value: fmt.Sprintf("%d of %d slots", covered, clusterSlots),
			Detail: fmt.Sprintf("%d slots have no live master: keys in them get 503 store_unavailable", clusterSlots-covered)})
	}

	var bare []string
	masters := 0
	for _, n := range nodes {
		if !n.Master || n.SlotCount() == 0 {
			continue
		}
		masters++
		if replicas[n.ID] == 0 {
			bare = append(bare, n.Addr)
		}
	}
	slices.Sort(bare)
	if len(bare) == 0 {
		out = append(out, Finding{Item: "cluster-replicas", Verdict: OK, Value: fmt.Sprintf("%d masters, each with a replica", masters),
			Detail: "a failed master's replica takes over its slots"})
	} else {
		out = append(out, Finding{Item: "cluster-replicas", Verdict: Warn,
			Value:  fmt.Sprintf("%d of %d masters without a live replica: %s", len(bare), masters, strings.Join(bare, ", ")),
			Detail: "when such a master fails its slots answer 503 until it returns, and without persistence its records are lost; give every master a replica"})
	}
	return out
}
