package main

import (
	"fmt"
	"math"
	"strings"
)

// The benchmarks of the memstore page.
const (
	benchMiddleware         = "BenchmarkMiddleware"
	benchMiddlewareParallel = "BenchmarkMiddlewareParallel"
	benchAcquireComplete    = "BenchmarkAcquireComplete"
	benchAcquireReplay      = "BenchmarkAcquireReplay"
	benchShardLocks         = "BenchmarkShardLocks"
	benchRecordMemory       = "BenchmarkRecordMemory"
	benchLoopback           = "BenchmarkLoopback"
	benchLoopbackPaired     = "BenchmarkLoopbackPaired"
)

var (
	middlewareStep = step{name: "middleware", pkg: ".", benches: []string{benchMiddleware}}
	parallelStep   = step{name: "middleware-parallel", pkg: ".", benches: []string{benchMiddlewareParallel}, cpu: "1,2"}
	memstoreStep   = step{name: "memstore", pkg: "./memstore/", benches: []string{benchAcquireComplete, benchAcquireReplay, benchShardLocks}, cpu: "1,2"}
	memoryStep     = step{name: "memstore-memory", pkg: "./memstore/", benches: []string{benchRecordMemory}, benchtime: "2x", quick: "2x", once: true}
	loopbackStep   = step{name: "loopback", tools: true, pkg: "./load/", benches: []string{benchLoopback, benchLoopbackPaired}}
)

var memstorePage = page{
	file:    "memstore.md",
	title:   "memstore",
	about:   "the middleware on memstore in process, at GOMAXPROCS 1 and 2, memstore's own calls, memory per record, whole requests over loopback HTTP",
	steps:   []*step{&middlewareStep, &parallelStep, &memstoreStep, &memoryStep, &loopbackStep},
	targets: memstoreTargets,
	body:    memstoreBody,
}

// middlewareCases are the cases of BenchmarkMiddleware and
// BenchmarkMiddlewareParallel; middlewareSizes the body sizes of the first.
var (
	middlewareCases = []string{"Bare", "FirstExecution", "Replay", "Conflict", "Mismatch"}
	middlewareSizes = []int{0, 1 << 10, 64 << 10}
)

// loopbackCases are the cases of BenchmarkLoopback, loopbackClients its
// client counts; BenchmarkLoopbackPaired runs the middleware's cases with
// one client.
var (
	loopbackCases   = []string{"Bare", "FirstExecution", "Replay", "CachedReplay"}
	loopbackClients = []int{1, 16}
)

// memstoreTargets judges allocations, throughput over loopback, scaling
// with GOMAXPROCS and memory per record.
func memstoreTargets(ms *measured) [][]string {
	return [][]string{
		allocTarget(ms),
		loopbackTarget(ms, "replay ≥ 0.85× the bare handler's throughput", "Replay", "dup=100", 0.85),
		loopbackTarget(ms, "first execution ≥ 0.75×", "FirstExecution", "new=100", 0.75),
		cachedReplayTarget(ms),
		scaleTarget(ms),
		memoryTarget(ms),
	}
}

func memstoreBody(ms *measured, d *doc) {
	ms.inProcessSection(d)
	ms.parallelSection(d)
	ms.memorySection(d)
	ms.loopbackSection(d)
	ms.cachedReplaySection(d)
}

// middlewareRow is the name of a row of BenchmarkMiddleware.
func middlewareRow(name string, size int) string {
	return fmt.Sprintf("%s/%s/body=%d", benchMiddleware, name, size)
}

// allocsAbove is how many objects case name allocates per request beyond
// the bare handler, at a body of size bytes.
func (ms *measured) allocsAbove(name string, size int) (float64, bool) {
	mw := ms.of(&middlewareStep)
	bare, ok1 := val(mw, middlewareRow("Bare", size), procs, "allocs/op")
	al, ok2 := val(mw, middlewareRow(name, size), procs, "allocs/op")
	return al.med - bare.med, ok1 && ok2
}

// allocTarget reports allocations above the bare handler; they are
// reported, not judged.
func allocTarget(ms *measured) []string {
	var parts []string
	for _, size := range middlewareSizes {
		for _, c := range []struct{ name, short string }{{"FirstExecution", "first"}, {"Replay", "replay"}} {
			if above, ok := ms.allocsAbove(c.name, size); ok {
				parts = append(parts, fmt.Sprintf("%s %s +%.0f", sizeName(size), c.short, above))
			}
		}
	}
	return []string{"memstore in process: allocations above the bare handler (first execution, replay)", strings.Join(parts, "; "), "reported, not judged"}
}

func (ms *measured) inProcessSection(d *doc) {
	d.heading(2, "In process")
	d.commands(ms.c, &middlewareStep)
	d.para("`%s` (root package): one request through the middleware on memstore, no network, beside the bare handler. FirstExecution uses a fresh key per request (the store grows by b.N records); Replay repeats a completed key; Conflict hits a key whose handler is still running; Mismatch sends another body under a completed key.", benchMiddleware)
	mw := ms.of(&middlewareStep)
	var rows [][]string
	for _, size := range middlewareSizes {
		for _, name := range middlewareCases {
			base := middlewareRow(name, size)
			ns, nok := val(mw, base, procs, "ns/op")
			by, byok := val(mw, base, procs, "B/op")
			al, aok := val(mw, base, procs, "allocs/op")
			above := "–"
			if v, ok := ms.allocsAbove(name, size); ok {
				above = fmt.Sprintf("%.0f", v)
			}
			rows = append(rows, []string{name, sizeName(size), cell(ns, nok), cell(by, byok), cell(al, aok), above})
		}
	}
	d.table([]string{"case", "body", "ns/op", "B/op", "allocs/op", "allocs above bare"}, rows)
}

// scale is the throughput row base of r gains from GOMAXPROCS 1 to 2.
func scale(r *results, base string) (float64, bool) {
	a, ok1 := val(r, base, 1, "ns/op")
	b, ok2 := val(r, base, 2, "ns/op")
	return a.med / b.med, ok1 && ok2 && procs >= 2
}

// scaleCell formats a gain from GOMAXPROCS 1 to 2.
func scaleCell(v float64, ok bool) string {
	if !ok {
		return "–"
	}
	return fmt.Sprintf("×%.2f", v)
}

func scaleTarget(ms *measured) []string {
	st := ms.of(&memstoreStep)
	acS, okA := scale(st, benchAcquireComplete+"/Parallel")
	arS, okR := scale(st, benchAcquireReplay+"/Parallel")
	// The bare handler shares nothing between goroutines: its gain from a
	// second CPU is what this machine gives at best in the same run.
	control := ""
	bare, bareOK := scale(ms.of(&parallelStep), benchMiddlewareParallel+"/Bare")
	if bareOK {
		control = fmt.Sprintf("; the bare handler, which shares nothing, ×%.2f in the same run", bare)
	}
	// A bare lock per shard is the least any store that locks a shard per
	// call pays.
	if ls, ok := scale(st, benchShardLocks); ok {
		control += fmt.Sprintf("; shard locks alone (`%s`) ×%.2f", benchShardLocks, ls)
	}
	return []string{"memstore Acquire/Complete scale with GOMAXPROCS (-cpu 1,2)",
		fmt.Sprintf("throughput ×%.2f (acquire+complete), ×%.2f (replay) from 1 to 2 CPUs%s", acS, arS, control),
		scaleVerdict(okA && okR, acS, arS, bareOK, bare)}
}

// scaleVerdict judges the GOMAXPROCS row: acquire+complete and replay must
// each gain more than 20% from the second CPU. A run in which the bare
// handler (measured when bareOK) gained no more cannot show whether the
// store scales, and says so instead of "not met".
func scaleVerdict(ok bool, acquireComplete, replay float64, bareOK bool, bare float64) string {
	if ok && acquireComplete > 1.2 && replay > 1.2 {
		return verdict(true)
	}
	if bareOK && bare <= 1.2 {
		return "**not shown** (the bare handler did not scale either)"
	}
	return verdict(false)
}

func (ms *measured) parallelSection(d *doc) {
	d.heading(2, "GOMAXPROCS 1 and 2")
	d.commands(ms.c, &parallelStep, &memstoreStep)
	d.para("`%s` (1 KiB), ns/op at GOMAXPROCS 1 and 2 and the throughput gained:", benchMiddlewareParallel)
	mp := ms.of(&parallelStep)
	var rows [][]string
	for _, name := range middlewareCases {
		base := benchMiddlewareParallel + "/" + name
		a, ok1 := val(mp, base, 1, "ns/op")
		b, ok2 := val(mp, base, 2, "ns/op")
		rows = append(rows, []string{name, cell(a, ok1), cell(b, ok2), scaleCell(a.med/b.med, ok1 && ok2)})
	}
	d.table([]string{"case", "-cpu 1", "-cpu 2", "throughput 1→2"}, rows)

	d.para("memstore alone, ns/op at GOMAXPROCS 1 and 2:")
	st := ms.of(&memstoreStep)
	rows = nil
	for _, base := range []string{
		benchAcquireComplete + "/Serial", benchAcquireComplete + "/Parallel",
		benchAcquireReplay + "/Serial", benchAcquireReplay + "/Parallel", benchAcquireReplay + "/ParallelSameKey",
		benchShardLocks,
	} {
		a, ok1 := val(st, base, 1, "ns/op")
		b, ok2 := val(st, base, 2, "ns/op")
		al, ok3 := val(st, base, 2, "allocs/op")
		rows = append(rows, []string{strings.TrimPrefix(base, "Benchmark"), cell(a, ok1), cell(b, ok2), scaleCell(a.med/b.med, ok1 && ok2), cell(al, ok3)})
	}
	d.table([]string{"benchmark", "-cpu 1", "-cpu 2", "throughput 1→2", "allocs/op"}, rows)
}

// memorySizes are the body sizes of BenchmarkRecordMemory.
var memorySizes = []int{0, 1 << 10, 16 << 10}

// bodyCopies is how many bytes a first execution with a 64 KiB body
// allocates beyond a replay of it: the stored body, once.
func (ms *measured) bodyCopies() (float64, bool) {
	mw := ms.of(&middlewareStep)
	fe, ok1 := val(mw, middlewareRow("FirstExecution", 64<<10), procs, "B/op")
	rp, ok2 := val(mw, middlewareRow("Replay", 64<<10), procs, "B/op")
	return fe.med - rp.med, ok1 && ok2
}

func memoryTarget(ms *measured) []string {
	var overheads []float64
	for _, size := range memorySizes {
		if ov, ok := val(ms.of(&memoryStep), fmt.Sprintf("%s/body=%d", benchRecordMemory, size), procs, "overhead-bytes/record"); ok {
			overheads = append(overheads, ov.med)
		}
	}
	flat := len(overheads) == len(memorySizes) && math.Abs(overheads[len(overheads)-1]-overheads[0]) < 32
	// A first execution allocates the captured body and the copy memstore
	// keeps (it keeps nothing of the caller's bytes): two buffers, and
	// the record retains one.
	extra, ok := ms.bodyCopies()
	twoBuffers := ok && extra < 2*64<<10+8<<10
	return []string{"Memory: the record keeps one copy of the body; bytes/record proportional to the payload",
		fmt.Sprintf("first execution allocates %.1f KiB more than a replay for a 64 KiB body (the captured body and the store's copy); %s B/record beyond the body at 0 B, 1 KiB and 16 KiB", extra/1024, joinNums(overheads)),
		verdict(twoBuffers && flat)}
}

func (ms *measured) memorySection(d *doc) {
	d.heading(2, "Memory per record")
	d.commands(ms.c, &memoryStep)
	extra, _ := ms.bodyCopies()
	d.para("`%s`: heap held per COMPLETE record (20 000 records, a Content-Type and a Location header), and the part beyond the body (key, token, fingerprint, record, and the status and headers, which memstore keeps as one block of bytes that the garbage collector does not scan). That part is constant, so a record costs its body plus about that much. The stored body is the recorder's capture buffer itself: at 64 KiB a first execution allocates %.1f KiB more than a replay (which reads the same request body; `%s` above), i.e. the one stored buffer and no second copy.", benchRecordMemory, extra/1024, benchMiddleware)
	var rows [][]string
	for _, size := range memorySizes {
		base := fmt.Sprintf("%s/body=%d", benchRecordMemory, size)
		per, ok1 := val(ms.of(&memoryStep), base, procs, "bytes/record")
		ov, ok2 := val(ms.of(&memoryStep), base, procs, "overhead-bytes/record")
		rows = append(rows, []string{sizeName(size), cell(per, ok1), cell(ov, ok2)})
	}
	d.table([]string{"body", "bytes/record", "beyond the body, bytes/record"}, rows)
}

// loopbackRatio is the throughput of case name over loopback HTTP with
// clients clients, relative to the bare handler's.
func (ms *measured) loopbackRatio(name string, clients int) (float64, bool) {
	lb := ms.of(&loopbackStep)
	b, ok1 := val(lb, fmt.Sprintf("%s/Bare/clients=%d", benchLoopback, clients), procs, "ns/op")
	x, ok2 := val(lb, fmt.Sprintf("%s/%s/clients=%d", benchLoopback, name, clients), procs, "ns/op")
	return b.med / x.med, ok1 && ok2
}

// pairedRow is the name of a row of BenchmarkLoopbackPaired.
func pairedRow(name string) string { return fmt.Sprintf("%s/%s/clients=1", benchLoopbackPaired, name) }

// loopbackTarget judges the throughput of case name over loopback HTTP
// against the bare handler's: idemload with mix decides, the benchmarks
// are quoted beside it.
func loopbackTarget(ms *measured, target, name, mix string, least float64) []string {
	const clients = 16
	idem, ok := ms.idemloadRatio(false, mix, clients, "bare")
	bench, _ := ms.loopbackRatio(name, clients)
	paired, _ := val(ms.of(&loopbackStep), pairedRow(name), procs, "throughput-ratio")
	return []string{"memstore over loopback HTTP, 1 KiB: " + target,
		fmt.Sprintf("idemload (%d clients) %.2f×; %s (%d clients) %.2f×; paired, 1 client %.2f×", clients, idem, benchLoopback, clients, bench, paired.med),
		verdict(ok && idem >= least)}
}

func (ms *measured) loopbackSection(d *doc) {
	d.heading(2, "Over loopback HTTP")
	d.commands(ms.c, &loopbackStep)
	d.para("`%s`: whole HTTP requests from an in-process client to a server on 127.0.0.1, 1 KiB response. Throughput is 10⁹ / ns/op. `%s` alternates a bare and a middleware request from one client, so both see the same background load, and reports bare time / middleware time.", benchLoopback, benchLoopbackPaired)
	lb := ms.of(&loopbackStep)
	var rows [][]string
	for _, clients := range loopbackClients {
		for _, name := range loopbackCases {
			ns, ok := val(lb, fmt.Sprintf("%s/%s/clients=%d", benchLoopback, name, clients), procs, "ns/op")
			rs := "–"
			if r, rok := ms.loopbackRatio(name, clients); rok {
				rs = fmt.Sprintf("%.2f×", r)
			}
			rows = append(rows, []string{name, fmt.Sprint(clients), cell(ns, ok), fmt.Sprintf("%.0f", 1e9/ns.med), rs})
		}
	}
	d.table([]string{"case", "clients", "ns/op", "req/s", "throughput vs bare"}, rows)
	rows = nil
	for _, name := range loopbackCases[1:] { // the middleware's cases
		b, ok1 := val(lb, pairedRow(name), procs, "bare-µs/req")
		m, ok2 := val(lb, pairedRow(name), procs, "mw-µs/req")
		r, ok3 := val(lb, pairedRow(name), procs, "throughput-ratio")
		rows = append(rows, []string{name, cell(b, ok1), cell(m, ok2), cell(r, ok3)})
	}
	d.table([]string{"paired, 1 client", "bare µs/req", "middleware µs/req", "throughput ratio"}, rows)
}
