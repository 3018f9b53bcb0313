package main

import (
	"fmt"
	"math"
	"strings"
)

// benchKeyCount is the key-count benchmark of memstore and of redisstore.
const benchKeyCount = "BenchmarkKeyCount"

var (
	memstoreKeyCountStep = step{name: "memstore-keycount", pkg: "./memstore/", benches: []string{benchKeyCount}}
	// An op of redisstore's BenchmarkKeyCount is 4 requests, one per size.
	redisKeyCountStep = step{name: "redis-keycount", pkg: "./redisstore/", benches: []string{benchKeyCount}, benchtime: "3000x", quick: "1000x", redis: true}
)

var keyCountPage = page{
	file:    "keycount.md",
	title:   "Key count",
	about:   "the cost of a request's store calls against the number of live records, 10³ to 10⁶, on memstore and Redis",
	steps:   []*step{&memstoreKeyCountStep, &redisKeyCountStep},
	targets: keyCountTargets,
	body:    keyCountBody,
}

var keyCounts = []int{1_000, 10_000, 100_000, 1_000_000}

// keyCountCases are the cases of BenchmarkKeyCount, with their names in
// the plot's legend.
var keyCountCases = []struct{ name, legend, color string }{
	{"Replay", "replay", "#1f77b4"},
	{"FirstExecution", "first execution", "#d62728"},
}

// keyCountStore is one store's curves: the step that measures them and the
// unit the table and the plot give them in.
type keyCountStore struct {
	name, title string
	step        *step
	unit        string
	div         float64 // ns per unit
}

func (ms *measured) keyCountStores() []keyCountStore {
	stores := []keyCountStore{{"memstore", "memstore (store calls, in process)", &memstoreKeyCountStep, "ns", 1}}
	if ms.c.redis {
		stores = append(stores, keyCountStore{"Redis", "Redis (store calls, loopback)", &redisKeyCountStep, "µs", 1000})
	}
	return stores
}

// keyCountVal returns the time of one request (ns) of case name at n live
// keys: from the row of that size (memstore's BenchmarkKeyCount runs the
// sizes one after another) or from the size's metric of the case's row
// (redisstore's runs them in lockstep).
func keyCountVal(r *results, name string, n int) (stat, bool) {
	if s, ok := val(r, fmt.Sprintf("%s/%s/keys=%d", benchKeyCount, name, n), procs, "ns/op"); ok {
		return s, true
	}
	return val(r, benchKeyCount+"/"+name, procs, fmt.Sprintf("ns/req@keys=%d", n))
}

// keyCountTargets judges whether each store's curves are flat: a curve is
// flat when its rise from 10³ to 10⁶ keys is within 10% of what a request
// costs anyway: for memstore a bare request over loopback HTTP (the store
// call alone is a few hundred nanoseconds, so cache misses on a larger map
// show as a large ratio of a small number), for Redis the 10³ value itself.
func keyCountTargets(ms *measured) [][]string {
	httpReq, httpOK := val(ms.of(&loopbackStep), benchLoopback+"/Bare/clients=1", procs, "ns/op")
	var rows [][]string
	for _, st := range ms.keyCountStores() {
		ok := true
		var parts []string
		for _, c := range keyCountCases {
			first, lo, hi := math.NaN(), math.Inf(1), 0.0
			for _, n := range keyCounts {
				if s, sok := keyCountVal(ms.of(st.step), c.name, n); sok {
					lo, hi = min(lo, s.med), max(hi, s.med)
					if math.IsNaN(first) {
						first = s.med
					}
				}
			}
			rise := hi - first
			if st.step == &memstoreKeyCountStep {
				ok = ok && httpOK && rise <= 0.1*httpReq.med
				parts = append(parts, fmt.Sprintf("%s +%.0f ns (%.1f%% of a %.0f µs loopback request)", c.name, rise, 100*rise/httpReq.med, httpReq.med/1000))
			} else {
				ok = ok && rise <= 0.1*first
				parts = append(parts, fmt.Sprintf("%s %+.0f%%", c.name, 100*rise/first))
			}
		}
		rows = append(rows, []string{fmt.Sprintf("%s: cost per request flat from 10³ to 10⁶ live keys", st.name),
			"largest rise over the 10³ value: " + strings.Join(parts, "; "), verdict(ok)})
	}
	return rows
}

// keyCountSummary writes the key-count section of BENCHMARKS.md: the plot.
func (ms *measured) keyCountSummary(d *doc) {
	d.heading(2, keyCountPage.title)
	d.para("What the store calls of one request cost against the number of live records (`%s`: in process for memstore, over loopback for Redis). The table, and how the sizes are measured, are on the [%s](%s) page.", benchKeyCount, keyCountPage.title, link(".", keyCountPage.path()))
	ms.keyCountPlot(d, ".")
}

// keyCountPlot writes the plot, for a file in directory from.
func (ms *measured) keyCountPlot(d *doc, from string) {
	d.para("![cost per request against live records](%s)", link(from, plotFile))
}

func keyCountBody(ms *measured, d *doc) {
	d.commands(ms.c, &memstoreKeyCountStep, &redisKeyCountStep)
	d.para("`%s` in memstore and in redisstore: store operations of one request (no HTTP) with 10³ to 10⁶ live COMPLETE records. Replay looks up a record picked at random among them; FirstExecution is Acquire of a new key then Complete. memstore runs the sizes one after another. Redis runs them in lockstep: databases 0 to 3 of one private server hold the four sizes, and each op makes the request once in each, in a rotating order, so that all sizes see the same background load (one size after another, the rows moved by tens of per cent with the machine's load). memstore records carry a 14-byte body; Redis records an empty body and one header, so that the 1.1 million of them fit in about 250 MB of redis-server memory (a 1 KiB body would need about 1.5 GB) — the body size does not change how either store finds a key.", benchKeyCount)
	ms.keyCountPlot(d, resultsDir)
	var rows [][]string
	for _, st := range ms.keyCountStores() {
		for _, c := range keyCountCases {
			row := []string{st.name, c.name + " (" + st.unit + "/op)"}
			lo, hi := math.Inf(1), 0.0
			for _, n := range keyCounts {
				s, ok := keyCountVal(ms.of(st.step), c.name, n)
				if ok {
					lo, hi = min(lo, s.med), max(hi, s.med)
				}
				s.med /= st.div
				row = append(row, cell(s, ok))
			}
			rows = append(rows, append(row, fmt.Sprintf("%.2f", hi/lo)))
		}
	}
	d.table([]string{"store", "case", "10³", "10⁴", "10⁵", "10⁶", "max/min"}, rows)
}

// keyCountChart draws the key-count plot, one panel per store.
func (ms *measured) keyCountChart() string {
	x := make([]float64, len(keyCounts))
	for i, n := range keyCounts {
		x[i] = float64(n)
	}
	var panels []panel
	for _, st := range ms.keyCountStores() {
		p := panel{title: st.title, yLabel: st.unit + " per request", x: x}
		for _, c := range keyCountCases {
			s := series{name: c.legend, color: c.color}
			for _, n := range keyCounts {
				v, ok := keyCountVal(ms.of(st.step), c.name, n)
				if !ok {
					v.med = math.NaN()
				}
				s.y = append(s.y, v.med/st.div)
			}
			p.series = append(p.series, s)
		}
		panels = append(panels, p)
	}
	return keyCountSVG("Cost per request against live records", panels)
}
