package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/redis/go-redis/v9"
)

// Verdict grades one Finding of a server check.
type Verdict int

// Verdicts, from the mildest. Info reports a fact without judging it; OK is
// safe; Warn is a risk the README explains (a restart or a failover can lose
// records, so keys can run again); Fail lets a duplicate run a handler a
// second time in ordinary operation, or stops the store from working.
const (
	Info Verdict = iota
	OK
	Warn
	Fail
)

var verdictNames = [...]string{"INFO", "OK", "WARN", "FAIL"}

// String returns "INFO", "OK", "WARN" or "FAIL".
func (v Verdict) String() string {
	if v >= 0 && int(v) < len(verdictNames) {
		return verdictNames[v]
	}
	return "Verdict(" + strconv.Itoa(int(v)) + ")"
}

// MarshalText encodes v as its String.
func (v Verdict) MarshalText() ([]byte, error) {
	if v < 0 || int(v) >= len(verdictNames) {
		return nil, fmt.Errorf("redisstore: unknown verdict %d", int(v))
	}
	return []byte(v.String()), nil
}

// UnmarshalText decodes a String of a Verdict, in any case.
func (v *Verdict) UnmarshalText(b []byte) error {
	for i, n := range verdictNames {
		if strings.EqualFold(string(b), n) {
			*v = Verdict(i)
			return nil
		}
	}
	return fmt.Errorf("redisstore: unknown verdict %q", b)
}

// Finding is one item of a Report: what was seen on a node (or on the
// deployment as a whole) and what it means for the store.
type Finding struct {
	// Item names what was checked: "role", "version", "maxmemory-policy",
	// "maxmemory", "persistence", "replication", "clock", "clock-spread",
	// "cluster-state", "cluster-slots", "cluster-replicas" or "reachable".
	Item string `json:"item"`
	// Node is the address of the node the finding is about, or empty for
	// one about the deployment as a whole (a Cluster's layout).
	Node    string  `json:"node,omitempty"`
	Verdict Verdict `json:"verdict"`
	// Value is what was seen, such as "allkeys-lru".
	Value string `json:"value"`
	// Detail says why it matters and what to do.
	Detail string `json:"detail"`
}

// Report is what Check found, deployment-wide findings first, then each
// node's in address order.
type Report struct {
	Findings []Finding `json:"findings"`
}

// Worst returns the gravest verdict among the findings (Info when there
// are none).
func (r Report) Worst() Verdict {
	w := Info
	for _, f := range r.Findings {
		w = max(w, f.Verdict)
	}
	return w
}

// Check reads the configuration and state of the Redis deployment the
// Store's client reaches and judges whether it keeps records safely: every
// node of a Cluster that CLUSTER NODES lists (through connections of the
// check's own, so the client's slot map is not reloaded), or the one node
// of a single-node or Sentinel client (its current master; a Sentinel
// deployment's replicas are not reached, so give them the same settings).
// It only reads (INFO, CONFIG GET, TIME, CLUSTER INFO, CLUSTER NODES) and
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
// A setting that CONFIG GET cannot read (a managed service that renames or
// forbids CONFIG) is judged from INFO where INFO tells, else reported as
// Info. Check returns an error, with no Report, when the deployment cannot
// be reached at all, or when ctx ends first; it returns by ctx's deadline
// even when the client does not honour deadlines.
func (s *Store) Check(ctx context.Context) (Report, error) {
	if s.closed.Load() {
		return Report{}, idempotency.ErrStoreClosed
	}
	if _, ok := ctx.Deadline(); !ok || s.deadlines {
		return checkClient(ctx, s.client)
	}
	type result struct {
		r   Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := checkClient(ctx, s.client)
		done <- result{r, err}
	}()
	select {
	case r := <-done:
		return r.r, r.err
	case <-ctx.Done():
		return Report{}, fmt.Errorf("redisstore: check: %w", ctx.Err())
	}
}

// startupCheckTimeout bounds the check CheckAndWarn runs.
var startupCheckTimeout = 5 * time.Second

// CheckAndWarn runs Check in a goroutine of its own and logs what it finds
// through logger (slog.Default() when logger is nil): each Fail finding at
// Error and each Warn finding at Warn, with the item, node, value and
// detail as attributes, and a check that could not run at Warn. Nothing is
// logged when every finding is OK or Info.
//
// New calls it with slog.Default(), or with the logger of
// WithStartupCheck, unless WithoutStartupCheck is given; call it yourself
// to check again, for example after a failover.
//
// It returns at once, without touching the network; the check gives up
// after 5 seconds, or when the Store is closed, and nothing is logged
// after Close. The returned channel is closed once the check has ended and
// its records are logged (most callers ignore it).
func (s *Store) CheckAndWarn(logger *slog.Logger) <-chan struct{} {
	if logger == nil {
		logger = slog.Default()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), startupCheckTimeout)
		defer cancel()
		go func() {
			select {
			case <-s.closing:
				cancel()
			case <-ctx.Done():
			}
		}()
		r, err := s.Check(ctx)
		if s.closed.Load() {
			return
		}
		logCtx := context.Background()
		if err != nil {
			logger.LogAttrs(logCtx, slog.LevelWarn, "redisstore: could not check the Redis server",
				slog.String("error", err.Error()))
			return
		}
		for _, f := range r.Findings {
			level := slog.LevelWarn
			switch f.Verdict {
			case Fail:
				level = slog.LevelError
			case Warn:
			default:
				continue
			}
			attrs := []slog.Attr{slog.String("item", f.Item)}
			if f.Node != "" {
				attrs = append(attrs, slog.String("node", f.Node))
			}
			attrs = append(attrs, slog.String("value", f.Value), slog.String("detail", f.Detail))
			logger.LogAttrs(logCtx, level, "redisstore: unsafe Redis configuration", attrs...)
		}
	}()
	return done
}

// deployment is how the client reaches Redis.
type deployment int

const (
	single deployment = iota
	sentinel
	cluster
)

// sentinelAddr is the address go-redis gives the options of a client made
// by redis.NewFailoverClient.
const sentinelAddr = "FailoverClient"

// checkClient gathers and judges what client reaches.
func checkClient(ctx context.Context, client redis.UniversalClient) (Report, error) {
	switch c := client.(type) {
	case *redis.ClusterClient:
		return checkCluster(ctx, c)
	case *redis.Ring:
		return checkRing(ctx, c)
	}
	kind, addr := single, ""
	if c, ok := client.(*redis.Client); ok {
		addr = c.Options().Addr
		if addr == sentinelAddr {
			kind, addr = sentinel, ""
		}
	}
	n, err := gather(ctx, client, addr)
	if err != nil {
		return Report{}, fmt.Errorf("redisstore: check: %w", err)
	}
	return Report{Findings: judgeNode(n, kind)}, nil
}

// configParams are the settings Check reads with CONFIG GET.
var configParams = []string{"save", "appendfsync", "min-replicas-to-write", "min-replicas-max-lag"}

// nodeInfo is what one node told.
type nodeInfo struct {
	addr      string
	info      map[string]string // INFO's fields
	config    map[string]string // the CONFIG GET settings that answered
	configErr error             // why one did not, if one did not
	offset    time.Duration     // the node's clock minus this host's
	clockErr  error
}

// gather reads INFO, the settings of configParams and TIME from one node.
func gather(ctx context.Context, c redis.Cmdable, addr string) (nodeInfo, error) {
	n := nodeInfo{addr: addr, config: map[string]string{}}
	pipe := c.Pipeline()
	infoCmd := pipe.Info(ctx)
	cfgCmds := make([]*redis.MapStringStringCmd, len(configParams))
	for i, p := range configParams {
		cfgCmds[i] = pipe.ConfigGet(ctx, p)
	}
	var clientCmd *redis.Cmd
	if addr == "" {
		// The master a Sentinel named: its address is the local end of
		// this connection (CLIENT INFO, Redis 6.2 and later).
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
	after := time.Now()
	if err != nil {
		n.clockErr = err
	} else {
		mid := before.Add(after.Sub(before) / 2)
		n.offset = t.Sub(mid)
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

// parseInfo returns the fields of an INFO reply.
func parseInfo(text string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
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

// judgeNode returns the findings about one node, in a fixed order.
func judgeNode(n nodeInfo, kind deployment) []Finding {
	var out []Finding
	add := func(item string, v Verdict, value, detail string) {
		out = append(out, Finding{Item: item, Node: n.addr, Verdict: v, Value: value, Detail: detail})
	}
	role := n.info["role"]
	switch {
	case kind == cluster && role == "slave":
		add("role", Info, "replica", "a Cluster replica: takes over its master's slots on failover")
	case role == "slave":
		add("role", Fail, "replica",
			"this node is a replica: it refuses every script of the store (READONLY); point the client at the master, or use Sentinel")
	case role == "master":
		add("role", OK, "master", "writes go here")
	default:
		add("role", Info, fmt.Sprintf("%q", role), "INFO did not say master or replica")
	}

	add(judgeVersion(n))
	add(judgePolicy(n))
	add(judgeMaxmemory(n))
	add(judgePersistence(n))
	add(judgeReplication(n, kind))
	if kind != cluster {
		if n.clockErr != nil {
			add("clock", Info, "unknown", "TIME failed: "+n.clockErr.Error())
		} else {
			add("clock", Info, describeOffset(n.offset),
				"leases are judged by the server's clock alone; keep every Redis host on NTP (a failover hands leases to another host's clock)")
		}
	}
	return out
}

func describeOffset(d time.Duration) string {
	d = d.Round(time.Millisecond)
	switch {
	case d > 0:
		return d.String() + " ahead of this host"
	case d < 0:
		return (-d).String() + " behind this host"
	}
	return "in step with this host"
}

// majorVersion returns the major version of a "7.0.15"-style version.
func majorVersion(v string) (int, bool) {
	m, _, _ := strings.Cut(v, ".")
	n, err := strconv.Atoi(m)
	return n, err == nil
}

func judgeVersion(n nodeInfo) (string, Verdict, string, string) {
	v := n.info["redis_version"]
	value := "redis " + v
	if vk := n.info["valkey_version"]; vk != "" {
		value = "valkey " + vk + " (redis_version " + v + ")"
	}
	major, ok := majorVersion(v)
	switch {
	case !ok:
		return "version", Info, fmt.Sprintf("%q", v), "INFO did not give a version"
	case major >= 7:
		return "version", OK, value, "scripts carry allow-oom: at maxmemory, requests already running still complete"
	}
	return "version", Warn, value,
		"before Redis 7 scripts cannot carry allow-oom: at maxmemory, Complete and Extend of a running request are refused, and its key runs again after the lease; upgrade, or keep memory well below maxmemory and alert on it"
}

func judgePolicy(n nodeInfo) (string, Verdict, string, string) {
	p, ok := n.info["maxmemory_policy"]
	switch {
	case !ok:
		return "maxmemory-policy", Info, "unknown", "INFO did not give maxmemory_policy"
	case p == "noeviction":
		return "maxmemory-policy", OK, p, "records are never evicted; a full server answers new keys with 503 store_full"
	}
	return "maxmemory-policy", Fail, p,
		"an evicting policy lets Redis delete a record before its TTL: an evicted record's duplicate runs the handler a second time; set maxmemory-policy noeviction"
}

func judgeMaxmemory(n nodeInfo) (string, Verdict, string, string) {
	limit, err1 := strconv.ParseInt(n.info["maxmemory"], 10, 64)
	used, err2 := strconv.ParseInt(n.info["used_memory"], 10, 64)
	switch {
	case err1 != nil:
		return "maxmemory", Info, "unknown", "INFO did not give maxmemory"
	case limit == 0:
		return "maxmemory", Warn, "0 (no limit)",
			"without maxmemory Redis grows until the host runs out of memory (swapping, or the kernel killing it and losing every record) instead of answering new keys with 503 store_full; set maxmemory below the host's memory"
	case err2 != nil:
		return "maxmemory", OK, formatBytes(limit), "set"
	}
	pct := float64(used) * 100 / float64(limit)
	value := fmt.Sprintf("%s of %s used (%.0f%%)", formatBytes(used), formatBytes(limit), pct)
	if used >= limit {
		return "maxmemory", Fail, value,
			"full: new keys get 503 store_full now (requests already running still complete); raise maxmemory, shorten TTLs or lower the response body cap"
	}
	if pct >= 90 {
		return "maxmemory", Warn, value,
			"nearly full: at maxmemory new keys get 503 store_full; raise maxmemory, shorten TTLs or lower the response body cap"
	}
	return "maxmemory", OK, value, "a full server answers new keys with 503 store_full"
}

func judgePersistence(n nodeInfo) (string, Verdict, string, string) {
	aof := n.info["aof_enabled"] == "1"
	fsync := n.config["appendfsync"]
	save, saveKnown := n.config["save"]
	unknown := func() string {
		if n.configErr != nil {
			return "; " + n.configErr.Error()
		}
		return ""
	}
	switch {
	case aof && fsync == "always":
		return "persistence", OK, "appendonly yes, appendfsync always",
			"each write is on disk before its reply: a crash loses no record"
	case aof && fsync == "everysec":
		return "persistence", OK, "appendonly yes, appendfsync everysec",
			"a redis-server crash loses no record; a power loss or kernel crash loses the last second or two of writes, whose keys can run again"
	case aof && fsync == "no":
		return "persistence", Warn, "appendonly yes, appendfsync no",
			"the kernel writes the AOF out when it likes (about every 30s on Linux): a power loss or kernel crash loses that much, and those keys can run again; use appendfsync everysec or always"
	case aof:
		return "persistence", Info, "appendonly yes, appendfsync unknown", "AOF is on" + unknown()
	case saveKnown && save != "":
		return "persistence", Warn, fmt.Sprintf("appendonly no, save %q", save),
			"RDB snapshots only: a restart loses every record written since the last snapshot, and their keys can run again; set appendonly yes (appendfsync everysec or always)"
	case saveKnown:
		return "persistence", Warn, `appendonly no, save ""`,
			"nothing persists: a restart loses every record, and every key completed or in flight can run again; set appendonly yes (appendfsync everysec or always)"
	}
	return "persistence", Info, "appendonly no, save unknown", "AOF is off; RDB snapshots unknown" + unknown()
}

func judgeReplication(n nodeInfo, kind deployment) (string, Verdict, string, string) {
	if n.info["role"] == "slave" {
		master := hostPort(n.info["master_host"], n.info["master_port"])
		if st := n.info["master_link_status"]; st != "up" {
			return "replication", Warn, "replica of " + master + ", link " + st,
				"the replica is not receiving its master's writes: a failover to it would lose records"
		}
		return "replication", OK, "replica of " + master + ", link up", "receiving its master's writes"
	}
	replicas, _ := strconv.Atoi(n.info["connected_slaves"])
	if replicas == 0 && kind != sentinel {
		return "replication", OK, "no replicas",
			"one copy of each record: min-replicas-to-write does not apply (persistence decides what a restart loses)"
	}
	// INFO shows min_slaves_good_slaves only while min-replicas-to-write
	// and min-replicas-max-lag are both set: that tells whether the master
	// refuses writes it cannot replicate even when CONFIG GET is refused.
	goodText, on := n.info["min_slaves_good_slaves"]
	minN, minErr := strconv.Atoi(n.config["min-replicas-to-write"])
	lag := n.config["min-replicas-max-lag"]
	if !on {
		return "replication", Warn, fmt.Sprintf("min-replicas-to-write 0, %d replicas", replicas),
			"a master cut off from its replicas and Sentinels, but not from clients, keeps taking writes that are discarded on heal, and their keys run again: set min-replicas-to-write 1 and min-replicas-max-lag 1, with at least two replicas (redisstore README, Split brain)"
	}
	good, _ := strconv.Atoi(goodText)
	if minErr != nil {
		return "replication", OK, fmt.Sprintf("min-replicas-to-write set, %d of %d replicas in time", good, replicas),
			"the master refuses writes it cannot replicate (exact settings unknown: " + errString(n.configErr) + ")"
	}
	value := fmt.Sprintf("min-replicas-to-write %d, min-replicas-max-lag %s, %d of %d replicas in time", minN, lag, good, replicas)
	switch {
	case good < minN:
		return "replication", Fail, value,
			"the master refuses writes now: fewer replicas than min-replicas-to-write acknowledged in time, so new keys get 503 store_unavailable; repair the replicas"
	case replicas <= minN:
		return "replication", Warn, value,
			"after a failover the promoted master has fewer replicas than min-replicas-to-write and refuses every write until the old master rejoins as its replica; run more replicas than min-replicas-to-write"
	}
	detail := "a master cut off from its replicas refuses writes within min-replicas-max-lag seconds"
	if l, err := strconv.Atoi(lag); err == nil && l > 1 {
		detail += fmt.Sprintf("; with %ds, a silently partitioned old master still runs requests for up to about %ds (1 is advised)", l, l+1)
	}
	return "replication", OK, value, detail
}

func hostPort(host, port string) string {
	if host == "" {
		return "?"
	}
	return host + ":" + port
}

func errString(err error) string {
	if err == nil {
		return "CONFIG GET gave nothing"
	}
	return err.Error()
}

// formatBytes renders n bytes in binary units.
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + " B"
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
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
		findings = append(findings, judgeNode(n, single)...)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return Report{}, fmt.Errorf("redisstore: check: %w", err)
	}
	slices.SortStableFunc(findings, func(a, b Finding) int { return strings.Compare(a.Node, b.Node) })
	return Report{Findings: findings}, nil
}

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
		return Report{}, fmt.Errorf("redisstore: check: CLUSTER NODES: %w", err)
	}
	stateText, err := cc.ClusterInfo(ctx).Result()
	if err != nil {
		return Report{}, fmt.Errorf("redisstore: check: CLUSTER INFO: %w", err)
	}
	listed := parseClusterNodes(nodesText)
	layout := judgeLayout(parseInfo(stateText), listed)
	// The master of slot 0, or any node when slot 0 has none: the client
	// whose options the node clients copy.
	template, err := cc.MasterForKey(ctx, "")
	if err != nil {
		return Report{}, fmt.Errorf("redisstore: check: %w", err)
	}
	templateHost, _, _ := net.SplitHostPort(template.Options().Addr)

	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		nodes []nodeInfo
		down  []Finding
	)
	for _, ln := range listed {
		if ln.failed {
			continue
		}
		addr := ln.addr
		if port, ok := strings.CutPrefix(addr, ":"); ok { // a node that has not learnt its own address yet
			addr = net.JoinHostPort(templateHost, port)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
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
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return Report{}, fmt.Errorf("redisstore: check: %w", err)
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

// clusterNode is one line of CLUSTER NODES.
type clusterNode struct {
	id, addr, masterID string
	master, failed     bool
	slots              int
}

// parseClusterNodes parses the reply of CLUSTER NODES, skipping lines it
// does not understand.
func parseClusterNodes(text string) []clusterNode {
	var nodes []clusterNode
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		n := clusterNode{id: f[0], addr: addr}
		for _, flag := range strings.Split(f[2], ",") {
			switch flag {
			case "master":
				n.master = true
			case "fail", "fail?", "noaddr", "handshake":
				n.failed = true
			}
		}
		if f[3] != "-" {
			n.masterID = f[3]
		}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") { // a slot being migrated or imported
				continue
			}
			lo, hi, isRange := strings.Cut(r, "-")
			a, err1 := strconv.Atoi(lo)
			b := a
			var err2 error
			if isRange {
				b, err2 = strconv.Atoi(hi)
			}
			if err1 == nil && err2 == nil && b >= a {
				n.slots += b - a + 1
			}
		}
		nodes = append(nodes, n)
	}
	return nodes
}

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// judgeLayout judges a Cluster's state, slot coverage and replicas.
func judgeLayout(info map[string]string, nodes []clusterNode) []Finding {
	var out []Finding
	state := info["cluster_state"]
	if state == "ok" {
		out = append(out, Finding{Item: "cluster-state", Verdict: OK, Value: "ok", Detail: "the Cluster serves every slot"})
	} else {
		out = append(out, Finding{Item: "cluster-state", Verdict: Fail, Value: fmt.Sprintf("%q", state),
			Detail: "the Cluster refuses commands (CLUSTERDOWN): every request gets 503"})
	}

	covered := 0
	replicas := map[string]int{}
	for _, n := range nodes {
		if n.master && !n.failed {
			covered += n.slots
		}
		if !n.master && !n.failed && n.masterID != "" {
			replicas[n.masterID]++
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
		if !n.master || n.slots == 0 {
			continue
		}
		masters++
		if replicas[n.id] == 0 {
			bare = append(bare, n.addr)
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
