package redistest

import (
	"strconv"
	"testing"
	"time"
)

// TestClusterWithReplicas starts a Cluster with replicas, moves a slot with
// its key to another master, fails that master over, and checks that the
// key follows. (The redisstore tests kill masters.)
func TestClusterWithReplicas(t *testing.T) {
	c := StartClusterWithReplicas(t, 3)
	if len(c.Nodes) != 6 {
		t.Fatalf("%d nodes, want 6", len(c.Nodes))
	}
	const key = "redistest-key"
	slot := c.KeySlot(t, key)
	from := c.MasterOf(t, slot)
	if _, err := Do(from.Addr(), "SET", key, "v"); err != nil {
		t.Fatal(err)
	}
	to := c.OtherMaster(t, from)
	start := time.Now()
	c.MigrateSlot(t, slot, from, to)
	t.Logf("slot %d moved from %s to %s in %v", slot, from.Addr(), to.Addr(), time.Since(start))
	if v, err := Do(to.Addr(), "GET", key); err != nil || v != "v" {
		t.Fatalf("GET on the new master = %q, %v", v, err)
	}
	if _, err := Do(from.Addr(), "GET", key); err == nil || err.Error() != "MOVED "+strconv.Itoa(slot)+" "+to.Addr() {
		t.Fatalf("GET on the old master: %v, want MOVED", err)
	}

	start = time.Now()
	promoted := c.Failover(t, to, slot)
	t.Logf("failover of %s to %s in %v", to.Addr(), promoted.Addr(), time.Since(start))
	if c.MasterOf(t, slot) != promoted || c.ReplicaOf(t, promoted) != to {
		t.Fatal("roles not swapped")
	}
	if v, err := Do(promoted.Addr(), "GET", key); err != nil || v != "v" {
		t.Fatalf("GET on the promoted master = %q, %v", v, err)
	}

}
