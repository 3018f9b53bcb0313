package clusternodes

import (
	"slices"
	"testing"
)

func TestParse(t *testing.T) {
	nodes, err := Parse("a1 10.0.0.1:6379@16379 myself,master - 0 0 1 connected 0-5460 7000\n" +
		"a2 :6380@16380 master,handshake - 0 0 2 connected [10923->-a3]\n" +
		"r1 10.0.0.4:6379@16379 slave,fail? a1 0 0 1 connected\n")
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 3 {
		t.Fatalf("%d nodes", len(nodes))
	}
	a1, a2, r1 := nodes[0], nodes[1], nodes[2]
	if a1.ID != "a1" || a1.Addr != "10.0.0.1:6379" || !a1.Master || a1.Failed || !slices.Equal(a1.Slots, [][2]int{{0, 5460}, {7000, 7000}}) {
		t.Errorf("a1 = %+v", a1)
	}
	if a1.SlotCount() != 5462 || !a1.Serves(7000) || a1.Serves(5461) {
		t.Errorf("a1 slots: %d", a1.SlotCount())
	}
	if a2.Addr != ":6380" || !a2.Failed || len(a2.Slots) != 0 {
		t.Errorf("a2 = %+v", a2)
	}
	if r1.Master || r1.MasterID != "a1" || !r1.Failed {
		t.Errorf("r1 = %+v", r1)
	}
	for _, bad := range []string{"a1 10.0.0.1:6379 master", "a1 x master - 0 0 1 connected 9-x", "a1 x master - 0 0 1 connected 9-3"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted it", bad)
		}
	}
}
