package servercheck

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis reads the configuration and state of the Redis deployment client
// reaches and judges whether it keeps redisstore's records safely: every
// node of a Cluster that CLUSTER NODES lists (through connections of the
// check's own, so the client's slot map is not reloaded), every shard of a
// Ring, or the one node of a single-node or Sentinel client (its current
// master; a Sentinel deployment's replicas are not reached, so give them
// the same settings). It only reads (INFO, CONFIG GET, PUBSUB NUMSUB,
// CLIENT INFO, TIME, and on a Cluster CLUSTER INFO and CLUSTER NODES) and
// writes nothing.
//
// The items, and their verdicts:
//
//   - role: the node a single-node or Sentinel client writes to is a
//     master (OK) or a replica, which refuses every script (Fail).
//   - version: Redis 7 or later (OK); older servers run the scripts
//     without allow-oom, so at maxmemory a running request cannot complete
//     and its key runs again after the lease (Warn).
//   - maxmemory-policy: noeviction (OK); any other policy lets Redis
//     delete a record before its TTL (Fail).
//   - maxmemory: set, and below 90% used (OK); at 90% or more (Warn); all
//     used, so new keys get 503 store_full (Fail); not set, so Redis grows
//     until the host runs out of memory instead of answering 503
//     store_full (Warn).
//   - persistence: AOF with appendfsync always or everysec (OK); AOF with
//     appendfsync no, RDB snapshots only, or nothing at all: a restart
//     loses records (Warn).
//   - replication: on a master with replicas, or behind Sentinel,
//     min-replicas-to-write of at least 1 (OK); 0, so a partitioned old
//     master keeps taking writes that are lost on heal (Warn); set, but
//     with no more replicas than it asks for, so a promoted master refuses
//     writes (Warn); more than the replicas in time right now: the master
//     refuses writes (Fail). On a replica: its link to its master is up
//     (OK) or down (Warn). A master without replicas outside Sentinel: OK.
//   - clock: the server's clock against this host's (Info; the
//     application's clocks do not matter). On a Cluster, clock-spread: the
//     nodes' clocks within a second of each other (OK) or not (Warn): after
//     a failover or slot migration a lease is judged by another node's
//     clock.
//   - cluster-state, cluster-slots, cluster-replicas (Cluster only): the
//     Cluster says ok and every slot has a live master (OK, else Fail);
//     every master has a live replica (OK, else Warn).
//   - reachable: a Cluster node that did not answer (Fail).
//
// The deployment is told by client's type: a *redis.ClusterClient is a
// Cluster, a *redis.Ring a set of shards, and anything else (a
// *redis.Client, Sentinel-backed or not) one node. go-redis gives a
// Sentinel-backed client (redis.NewFailoverClient) no type of its own, so
// whether a node is behind Sentinel is asked of the node: every Sentinel
// subscribes to __sentinel__:hello on the masters and replicas it monitors.
// That node's address is the one it reports for the check's connection
// (CLIENT INFO, Redis 6.2 and later).
//
// A setting that CONFIG GET cannot read (a managed service that renames or
// forbids CONFIG) is judged from INFO where INFO tells, else reported as
// Info; a user that may not run PUBSUB is taken to be outside Sentinel.
// Redis returns an error, with no Report, when the deployment cannot be
// reached at all, or when ctx ends first; it returns when ctx ends even
// when the client does not honour deadlines (without go-redis's
// ContextTimeoutEnabled), leaving the commands to end in the background.
// It panics when client is nil.
func Redis(ctx context.Context, client redis.UniversalClient) (Report, error) {
	if client == nil {
		panic("servercheck: Redis: nil client")
	}
	if ctx.Done() == nil { // a context that never ends
		return checkRedis(ctx, client)
	}
	type result struct {
		r   Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := checkRedis(ctx, client)
		done <- result{r, err}
	}()
	select {
	case r := <-done:
		return r.r, r.err
	case <-ctx.Done():
		return Report{}, fmt.Errorf("servercheck: %w", ctx.Err())
	}
}

// deployment is how the client reaches Redis.
type deployment int

const (
	single deployment = iota
	sentinel
	cluster
)

// checkRedis gathers and judges what client reaches.
func checkRedis(ctx context.Context, client redis.UniversalClient) (Report, error) {
	switch c := client.(type) {
	case *redis.ClusterClient:
		return checkCluster(ctx, c)
	case *redis.Ring:
		return checkRing(ctx, c)
	}
	n, err := gather(ctx, client, "")
	if err != nil {
		return Report{}, fmt.Errorf("servercheck: %w", err)
	}
	if c, ok := client.(*redis.Client); ok && n.addr == "" {
		n.addr = c.Options().Addr // a server that does not answer CLIENT INFO
	}
	return Report{Findings: judgeNode(n, n.deployment())}, nil
}

// checkRing checks every shard of a Ring as a node of its own.
func checkRing(ctx context.Context, ring *redis.Ring) (Report, error) {
	var (
		mu       sync.Mutex
		findings []Finding
	)
	err := ring.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error {
		n, err := gather(ctx, c, c.Options().Addr)
		if err != nil {
			return fmt.Errorf("%s: %w", c.Options().Addr, err)
		}
		mu.Lock()
		findings = append(findings, judgeNode(n, n.deployment())...)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return Report{}, fmt.Errorf("servercheck: %w", err)
	}
	slices.SortStableFunc(findings, func(a, b Finding) int { return strings.Compare(a.Node, b.Node) })
	return Report{Findings: findings}, nil
}

// configParams are the settings the check reads with CONFIG GET.
var configParams = []string{"save", "appendfsync", "min-replicas-to-write", "min-replicas-max-lag"}

// sentinelHello is the channel every Sentinel subscribes to on the masters
// and replicas it monitors.
const sentinelHello = "__sentinel__:hello"

// nodeInfo is what one node told.
type nodeInfo struct {
	addr      string
	info      map[string]string // INFO's fields
	config    map[string]string // the CONFIG GET settings that answered
	configErr error             // why one did not, if one did not
	sentinels int64             // subscribers of sentinelHello
	offset    time.Duration     // the node's clock minus this host's
	clockErr  error
}

// deployment returns how a node outside a Cluster is deployed.
func (n nodeInfo) deployment() deployment {
	if n.sentinels > 0 {
		return sentinel
	}
	return single
}

// gather reads INFO, the settings of configParams, the Sentinels' hello
// subscriptions and TIME from one node at addr; with addr empty, the
// node's address is the one CLIENT INFO reports for the connection.
func gather(ctx context.Context, c redis.Cmdable, addr string) (nodeInfo, error) {
	n := nodeInfo{addr: addr, config: map[string]string{}}
	pipe := c.Pipeline()
	infoCmd := pipe.Info(ctx)
	cfgCmds := make([]*redis.MapStringStringCmd, len(configParams))
	for i, p := range configParams {
		cfgCmds[i] = pipe.ConfigGet(ctx, p)
	}
	helloCmd := pipe.PubSubNumSub(ctx, sentinelHello)
	var clientCmd *redis.Cmd
	if addr == "" {
		clientCmd = pipe.Do(ctx, "CLIENT", "INFO")
	}
	_, _ = pipe.Exec(ctx)
	text, err := infoCmd.Result()
	if err != nil {
		return n, err
	}
	n.info = parseInfo(text)
	if clientCmd != nil {
		n.addr = localAddr(clientCmd.Val())
	}
	n.sentinels = helloCmd.Val()[sentinelHello]
	for i, p := range configParams {
		m, err := cfgCmds[i].Result()
		if v, ok := m[p]; ok && err == nil {
			n.config[p] = v
		} else if n.configErr == nil {
			if err == nil {
				err = errors.New("no such setting")
			}
			n.configErr = fmt.Errorf("CONFIG GET %s: %w", p, err)
		}
	}
	before := time.Now()
	t, err := c.Time(ctx).Result()
	if err != nil {
		n.clockErr = err
	} else {
		n.offset = clockOffset(t, before, time.Now())
	}
	return n, nil
}

// localAddr returns the laddr field of a CLIENT INFO reply, or "" when it
// has none.
func localAddr(reply any) string {
	text, _ := reply.(string)
	for _, f := range strings.Fields(text) {
		if v, ok := strings.CutPrefix(f, "laddr="); ok {
			return v
		}
	}
	return ""
}

// parseInfo returns the fields of an INFO (or CLUSTER INFO) reply.
func parseInfo(text string) map[string]string {
	m := map[string]string{}
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = v
		}
	}
	return m
}
