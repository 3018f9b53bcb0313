package main

import (
	"context"
	"testing"

	"github.com/go-idempotency/idempotency/internal/redistest"
)

// TestMeasureScripts runs the script measurement against a real server:
// every edge and record floor runs without error and gets a time.
func TestMeasureScripts(t *testing.T) {
	t.Setenv("REDIS_ADDR", redistest.Addr(t))
	costs, err := measureScripts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(costs.rows) != 8 {
		t.Fatalf("%d rows, want 8: %+v", len(costs.rows), costs.rows)
	}
	for _, r := range costs.rows {
		t.Logf("%-38s %5.1f µs", r.name, r.usec)
		if r.usec <= 0 {
			t.Errorf("%s: %.2f µs per call", r.name, r.usec)
		}
	}
	if floor, acquire := costs.rows[0], costs.rows[2]; acquire.usec <= floor.usec {
		t.Errorf("acquire of a new key (%.2f µs) costs no more than the floor script (%.2f µs)", acquire.usec, floor.usec)
	}
}
