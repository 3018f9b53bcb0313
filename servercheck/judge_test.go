package servercheck

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/internal/clusternodes"
)

// node returns a nodeInfo as a healthy single master would give it, with
// the fields in set changed (an empty value deletes the field).
func node(set map[string]string, config map[string]string) nodeInfo {
	info := map[string]string{
		"role": "master", "redis_version": "7.2.4", "maxmemory_policy": "noeviction",
		"maxmemory": "1000", "used_memory": "100", "aof_enabled": "1", "connected_slaves": "0",
	}
	for k, v := range set {
		if v == "" {
			delete(info, k)
		} else {
			info[k] = v
		}
	}
	cfg := map[string]string{"appendfsync": "everysec", "save": "", "min-replicas-to-write": "0", "min-replicas-max-lag": "10"}
	for k, v := range config {
		cfg[k] = v
	}
	return nodeInfo{addr: "10.0.0.1:6379", info: info, config: cfg}
}

func TestJudgeNode(t *testing.T) {
	refused := errors.New("ERR unknown command 'CONFIG'")
	cases := []struct {
		name string
		n    nodeInfo
		kind deployment
		item string
		want Verdict
	}{
		{"healthy", node(nil, nil), single, "version", OK},
		{"redis 6", node(map[string]string{"redis_version": "6.2.14"}, nil), single, "version", Warn},
		{"valkey", node(map[string]string{"valkey_version": "8.0.1"}, nil), single, "version", OK},
		{"replica on a single-node client", node(map[string]string{"role": "slave", "master_link_status": "up"}, nil), single, "role", Fail},
		{"replica in a cluster", node(map[string]string{"role": "slave", "master_link_status": "up"}, nil), cluster, "role", Info},
		{"replica link down", node(map[string]string{"role": "slave", "master_link_status": "down"}, nil), cluster, "replication", Warn},
		{"90% used", node(map[string]string{"used_memory": "900"}, nil), single, "maxmemory", Warn},
		{"89% used", node(map[string]string{"used_memory": "890"}, nil), single, "maxmemory", OK},
		{"full", node(map[string]string{"used_memory": "1000"}, nil), single, "maxmemory", Fail},
		{"past maxmemory", node(map[string]string{"used_memory": "1150"}, nil), single, "maxmemory", Fail},
		{"no maxmemory", node(map[string]string{"maxmemory": "0"}, nil), single, "maxmemory", Warn},
		{"allkeys-lfu", node(map[string]string{"maxmemory_policy": "allkeys-lfu"}, nil), single, "maxmemory-policy", Fail},
		{"sentinel without min-replicas", node(nil, nil), sentinel, "replication", Warn},
		{"sentinel with min-replicas and two replicas", node(
			map[string]string{"connected_slaves": "2", "min_slaves_good_slaves": "2"},
			map[string]string{"min-replicas-to-write": "1", "min-replicas-max-lag": "1"}), sentinel, "replication", OK},
		{"min-replicas set, CONFIG refused", func() nodeInfo {
			n := node(map[string]string{"connected_slaves": "2", "min_slaves_good_slaves": "2"}, nil)
			n.config, n.configErr = map[string]string{}, refused
			return n
		}(), single, "replication", OK},
		{"min-replicas unset, CONFIG refused", func() nodeInfo {
			n := node(map[string]string{"connected_slaves": "2"}, nil)
			n.config, n.configErr = map[string]string{}, refused
			return n
		}(), single, "replication", Warn},
		{"persistence, CONFIG refused, AOF off", func() nodeInfo {
			n := node(map[string]string{"aof_enabled": "0"}, nil)
			n.config, n.configErr = map[string]string{}, refused
			return n
		}(), single, "persistence", Info},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got *Finding
			for _, f := range judgeNode(c.n, c.kind) {
				if f.Item == c.item {
					got = &f
				}
			}
			if got == nil {
				t.Fatalf("no %s finding", c.item)
			}
			if got.Verdict != c.want {
				t.Errorf("%s: %v (%q: %s), want %v", c.item, got.Verdict, got.Value, got.Detail, c.want)
			}
			if got.Node != c.n.addr || got.Detail == "" || got.Value == "" {
				t.Errorf("finding incomplete: %+v", *got)
			}
		})
	}
}

func TestJudgeLayout(t *testing.T) {
	nodes, err := clusternodes.Parse(strings.Join([]string{
		"a1 10.0.0.1:6379@16379 myself,master - 0 0 1 connected 0-5460",
		"a2 10.0.0.2:6379@16379 master - 0 0 2 connected 5461-10922 [10923->-a3]",
		"a3 10.0.0.3:6379@16379 master,fail - 0 0 3 connected 10923-16383",
		"r1 10.0.0.4:6379@16379 slave a1 0 0 1 connected",
		"r2 10.0.0.5:6379@16379 slave,fail a2 0 0 2 connected",
	}, "\n"))
	if err != nil {
		t.Fatal(err)
	}
	f := judgeLayout(map[string]string{"cluster_state": "fail"}, nodes)
	want := map[string]Verdict{"cluster-state": Fail, "cluster-slots": Fail, "cluster-replicas": Warn}
	for _, x := range f {
		if want[x.Item] != x.Verdict {
			t.Errorf("%s: %v (%s), want %v", x.Item, x.Verdict, x.Value, want[x.Item])
		}
	}
	if f[1].Value != "10923 of 16384 slots" {
		t.Errorf("cluster-slots value %q", f[1].Value)
	}
	if !strings.Contains(f[2].Value, "10.0.0.2:6379") || !strings.Contains(f[2].Value, "10.0.0.3:6379") || strings.Contains(f[2].Value, "10.0.0.1:6379") {
		t.Errorf("cluster-replicas value %q", f[2].Value)
	}
}

func TestJudgeClockSpread(t *testing.T) {
	nodes := []nodeInfo{{addr: "a", offset: -200 * time.Millisecond}, {addr: "b", offset: 900 * time.Millisecond}, {addr: "c", clockErr: errors.New("x")}}
	f := judgeClockSpread(nodes)
	if f.Verdict != Warn || f.Value != "1.1s between a and b" {
		t.Errorf("spread %+v, want WARN for 1.1s", f)
	}
	nodes[1].offset = 700 * time.Millisecond
	if f := judgeClockSpread(nodes); f.Verdict != OK {
		t.Errorf("spread %+v, want OK", f)
	}
}

// TestHostPort: a replica's master address is written as a dialable
// address, with an IPv6 host in brackets.
func TestHostPort(t *testing.T) {
	for _, c := range []struct{ host, port, want string }{
		{"10.0.0.7", "6379", "10.0.0.7:6379"},
		{"::1", "6379", "[::1]:6379"},
		{"", "6379", "?"},
	} {
		if got := hostPort(c.host, c.port); got != c.want {
			t.Errorf("hostPort(%q, %q) = %q, want %q", c.host, c.port, got, c.want)
		}
	}
}
