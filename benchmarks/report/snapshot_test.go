package main

import (
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestSnapshotRoundTrip: -render reads back exactly what a run saved, so it
// writes the same files as the run did.
func TestSnapshotRoundTrip(t *testing.T) {
	dir := t.TempDir()
	c := config{count: 3, rounds: 2, duration: 1500 * time.Millisecond, redis: true, postgres: true}
	res := map[string]*results{}
	for _, st := range steps(c) {
		if err := os.WriteFile(filepath.Join(dir, st.name+".txt"), []byte(sample), 0o644); err != nil {
			t.Fatal(err)
		}
		r := newResults()
		r.parse(strings.NewReader(sample))
		res[st.name] = r
	}
	want := &measured{
		c:       c,
		m:       machineInfo{cpu: "cpu", kernel: "Linux 6", goVersion: "go1.x", redis: "Redis 7", postgres: "PostgreSQL 15 (fsync on, synchronous_commit on)", cores: 2, load: "0.1 0.2 0.3", generated: time.Date(2026, 11, 30, 6, 5, 0, 0, time.UTC)},
		res:     res,
		loads:   []loadRun{{args: []string{"-mix", "new=100"}, output: "throughput 1 req/s"}},
		scripts: &scriptCosts{rows: []scriptCost{{name: "acquire", calls: 5, commands: "HMGET, EXISTS", usec: 9.5}}},
		peers:   "peers output\n",
	}
	if err := want.save(dir); err != nil {
		t.Fatal(err)
	}
	got, err := loadMeasured(config{count: 9}, dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.c != want.c || got.m != want.m || got.peers != want.peers ||
		!reflect.DeepEqual(got.loads, want.loads) || !reflect.DeepEqual(got.scripts, want.scripts) {
		t.Fatalf("read back %+v, want %+v", got, want)
	}
	if !maps.Equal(want.files(), got.files()) {
		t.Fatal("the rendered report differs after the round trip")
	}
	if _, err := loadMeasured(c, t.TempDir()); err == nil {
		t.Fatal("loadMeasured without a snapshot succeeded")
	}
	// Results saved before a step existed still render, without it.
	if err := os.Remove(filepath.Join(dir, "redis-cluster.txt")); err != nil {
		t.Fatal(err)
	}
	older, err := loadMeasured(c, dir)
	if err != nil {
		t.Fatalf("results without a later step: %v", err)
	}
	if _, ok := older.res["redis-cluster"]; ok || older.res["redis-phased"] == nil {
		t.Fatalf("steps read back: %v", slices.Collect(maps.Keys(older.res)))
	}
}
