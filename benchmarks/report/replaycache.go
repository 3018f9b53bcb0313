package main

import (
	"fmt"
	"strings"
)

// cachedReplayTarget judges a replay from replaycache (in front of
// memstore) against a replay from memstore alone, over loopback HTTP:
// BenchmarkLoopbackPaired's vs-replay decides, since it times the two side
// by side; BenchmarkLoopback's rows are quoted beside it.
func cachedReplayTarget(ms *measured) []string {
	lb := ms.of(&loopbackStep)
	paired, ok := val(lb, pairedRow("CachedReplay"), procs, "vs-replay")
	got := []string{"paired, 1 client –"}
	if ok {
		got[0] = "paired, 1 client " + ratioCell(paired)
	}
	for _, clients := range loopbackClients {
		if r, rok := ms.cachedVsReplay(clients); rok {
			got = append(got, fmt.Sprintf("%s (%d clients) %.2f×", benchLoopback, clients, r))
		}
	}
	return []string{"replaycache over loopback HTTP, 1 KiB: a cached replay ≥ 0.9× the memstore replay's throughput",
		strings.Join(got, "; "), verdict(ok && paired.med >= 0.9)}
}

// cachedVsReplay is the throughput of CachedReplay relative to Replay in
// BenchmarkLoopback with clients clients.
func (ms *measured) cachedVsReplay(clients int) (float64, bool) {
	lb := ms.of(&loopbackStep)
	r, ok1 := val(lb, fmt.Sprintf("%s/Replay/clients=%d", benchLoopback, clients), procs, "ns/op")
	c, ok2 := val(lb, fmt.Sprintf("%s/CachedReplay/clients=%d", benchLoopback, clients), procs, "ns/op")
	return r.med / c.med, ok1 && ok2
}

// cachedReplaySection is the part of the loopback section on replaycache.
func (ms *measured) cachedReplaySection(d *doc) {
	d.heading(3, "Replays from replaycache")
	d.para("`CachedReplay` is `Replay` with a replaycache in front of memstore: the duplicate is answered from the cache's copy of the record, without a store call. In `%s` each op also sends the same duplicate to the middleware on memstore alone, before or after the cached one in turn, and reports the cached replay's throughput relative to it (vs-replay). With memstore in the same process the two do the same work (a lookup under a lock and a decoded `Response`), so the ratio shows the cache costs nothing; against a store across a network it saves the round trip.", benchLoopbackPaired)
	lb := ms.of(&loopbackStep)
	var rows [][]string
	for _, clients := range loopbackClients {
		rs := "–"
		if r, ok := ms.cachedVsReplay(clients); ok {
			rs = fmt.Sprintf("%.2f×", r)
		}
		rows = append(rows, []string{benchLoopback, fmt.Sprint(clients), rs})
	}
	ref, ok1 := val(lb, pairedRow("CachedReplay"), procs, "replay-µs/req")
	cached, ok2 := val(lb, pairedRow("CachedReplay"), procs, "mw-µs/req")
	vs, ok3 := val(lb, pairedRow("CachedReplay"), procs, "vs-replay")
	vsCell := "–"
	if ok3 {
		vsCell = ratioCell(vs)
	}
	rows = append(rows, []string{fmt.Sprintf("%s (memstore %s µs, cached %s µs)", benchLoopbackPaired, cell(ref, ok1), cell(cached, ok2)), "1", vsCell})
	d.table([]string{"benchmark", "clients", "cached replay throughput vs memstore replay"}, rows)
}
