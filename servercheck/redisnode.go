package servercheck

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

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
		add("role", Info, strconv.Quote(role), "INFO did not say master or replica")
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
		return "version", Info, strconv.Quote(v), "INFO did not give a version"
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
	return net.JoinHostPort(host, port)
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
