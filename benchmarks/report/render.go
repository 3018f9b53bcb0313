package main

import (
	"fmt"
	"math"
	"runtime"
	"strconv"
	"strings"
)

var procs = runtime.GOMAXPROCS(0)

// doc builds the Markdown text.
type doc struct{ strings.Builder }

func (d *doc) p(format string, args ...any) { fmt.Fprintf(d, format+"\n", args...) }

func (d *doc) table(header []string, rows [][]string) {
	d.p("| %s |", strings.Join(header, " | "))
	seps := make([]string, len(header))
	for i := range seps {
		seps[i] = "---"
		if i > 0 {
			seps[i] = "---:"
		}
	}
	d.p("| %s |", strings.Join(seps, " | "))
	for _, r := range rows {
		d.p("| %s |", strings.Join(r, " | "))
	}
	d.p("")
}

// val returns the median of unit in row base (at GOMAXPROCS p), and false
// when the row was not measured.
func val(r *results, base string, p int, unit string) (stat, bool) {
	if r == nil {
		return stat{}, false
	}
	name := r.find(base, p)
	if name == "" {
		return stat{}, false
	}
	return r.get(name, unit)
}

// num formats v with about three significant digits.
func num(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1000:
		return fmt.Sprintf("%.0f", v)
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// cell formats a median with its spread when there are several samples.
func cell(s stat, ok bool) string {
	if !ok {
		return "–"
	}
	if s.n > 1 && s.spread >= 0.005 {
		return fmt.Sprintf("%s ±%.0f%%", num(s.med), 100*s.spread)
	}
	return num(s.med)
}

// ratioCell formats a median ratio with its spread.
func ratioCell(s stat) string {
	if s.n > 1 && s.spread >= 0.005 {
		return fmt.Sprintf("%.2f× ±%.0f%%", s.med, 100*s.spread)
	}
	return fmt.Sprintf("%.2f×", s.med)
}

func verdict(ok bool) string {
	if ok {
		return "**met**"
	}
	return "**not met**"
}

// sideBySide lists the Redis benchmarks that measure the middleware and its
// floors under the same background load. Where one was run, the summary
// takes its ratios for that number of clients from it: the rows of
// BenchmarkMiddlewareRedis run seconds apart, under different load.
var sideBySide = []struct {
	step, bench, suffix string // results step; row: bench/<case>/body=1024<suffix>
	clients             int
	how, title, text    string
}{
	{"redis-paired", "BenchmarkMiddlewareRedisPaired", "", 1, "in lockstep", "One client, in lockstep",
		"`BenchmarkMiddlewareRedisPaired`: one client sends, op after op, one request to the floor, one to the record floor, one to the store alone and one through the middleware, in an order that rotates, so that the four see the same background load; the table gives the mean time of each and the ratios to the floor. The one-client rows above run seconds apart, and on this shared machine the load changes between them by more than the differences measured; the summary takes the one-client ratios from here."},
	{"redis-phased", "BenchmarkMiddlewareRedisPhased", "/clients=64", 64, "in alternating phases", "64 clients, in alternating phases",
		"`BenchmarkMiddlewareRedisPhased`: each op runs four phases, one for the floor, one for the record floor, one for the store alone and one for the middleware, in an order that rotates; in each phase 64 goroutines send 25 requests each. Phases last a fraction of a second, so the four see the same background load; the table gives the time per request of each (wall time of its phases over their requests: the inverse of throughput) and the ratios to the floor. The summary takes the 64-client ratios from here."},
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

func sizeName(n int) string {
	switch {
	case n == 0:
		return "0 B"
	case n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

func render(c config, m machineInfo, res map[string]*results, loads []loadRun, scripts *scriptCosts, peers string) string {
	var d doc
	var summary [][]string
	d.p("# Benchmarks")
	d.p("")
	d.p("This file is generated: `go run ./benchmarks/report` runs every benchmark below and the `idemload` command, then rewrites this file and [`benchmarks/keycount.svg`](benchmarks/keycount.svg). The raw `go test` output is kept in [`benchmarks/results/`](benchmarks/results/) (feed it to benchstat to compare two runs), with the rest of what the run measured in `report.json`; `go run ./benchmarks/report -render` rewrites this file from them without measuring. Edit `benchmarks/report/` rather than this file.")
	d.p("")
	d.p("## Machine")
	d.p("")
	d.table([]string{"", ""}, [][]string{
		{"CPU", m.cpu},
		{"Cores (GOMAXPROCS)", fmt.Sprintf("%d (%d)", m.cores, procs)},
		{"OS", m.kernel},
		{"Go", m.goVersion},
		{"Redis", orDash(m.redis)},
		{"Load average at the end", m.load},
		{"Generated", m.generated.UTC().Format("2006-01-02 15:04 MST")},
		{"Samples per row", fmt.Sprintf("%d (`-count`); idemload: %d rounds of %v per target", c.count, c.rounds, c.duration)},
	})
	d.p("**Noise.** The machine is small and shared: other processes run tests at the same time, and client, server and redis-server share two cores. A cell shows the median of the samples and, after ±, the largest distance of a sample from it. Ratios are taken between rows of the same run; idemload alternates the targets round by round and reports the median of the rounds' ratios. Differences under about 10%% are within the noise.")
	d.p("")

	// memstore in process.
	mw := res["middleware"]
	var rows [][]string
	var allocParts, allocBad []string
	for _, size := range []int{0, 1 << 10, 64 << 10} {
		bare, bok := val(mw, fmt.Sprintf("BenchmarkMiddleware/Bare/body=%d", size), procs, "allocs/op")
		for _, name := range []string{"Bare", "FirstExecution", "Replay", "Conflict", "Mismatch"} {
			base := fmt.Sprintf("BenchmarkMiddleware/%s/body=%d", name, size)
			ns, nok := val(mw, base, procs, "ns/op")
			by, byok := val(mw, base, procs, "B/op")
			al, aok := val(mw, base, procs, "allocs/op")
			above := "–"
			if aok && bok {
				above = fmt.Sprintf("%.0f", al.med-bare.med)
				if name == "FirstExecution" || name == "Replay" {
					short := map[string]string{"FirstExecution": "first", "Replay": "replay"}[name]
					allocParts = append(allocParts, fmt.Sprintf("%s %s +%.0f", sizeName(size), short, al.med-bare.med))
					if al.med-bare.med > 12 {
						allocBad = append(allocBad, sizeName(size)+" "+short)
					}
				}
			}
			rows = append(rows, []string{name, sizeName(size), cell(ns, nok), cell(by, byok), cell(al, aok), above})
		}
	}
	allocVerdict := verdict(len(allocBad) == 0)
	if len(allocBad) > 0 && len(allocBad) < len(allocParts) {
		allocVerdict = "**not met** for " + strings.Join(allocBad, ", ") + "; **met** for the others"
	}
	summary = append(summary, []string{"memstore in process: ≤ 12 allocations above the bare handler (first execution, replay)",
		strings.Join(allocParts, "; "), allocVerdict})

	// Loopback HTTP.
	lb := res["loopback"]
	ratio := func(name string, clients int) (float64, bool) {
		b, ok1 := val(lb, fmt.Sprintf("BenchmarkLoopback/Bare/clients=%d", clients), procs, "ns/op")
		x, ok2 := val(lb, fmt.Sprintf("BenchmarkLoopback/%s/clients=%d", name, clients), procs, "ns/op")
		return b.med / x.med, ok1 && ok2
	}
	paired := func(name string) (stat, bool) {
		return val(lb, fmt.Sprintf("BenchmarkLoopbackPaired/%s/clients=1", name), procs, "throughput-ratio")
	}
	idemRatio := func(mix string) (float64, bool) {
		for _, l := range loads {
			if !contains(l.args, "-redis") && argAfter(l.args, "-mix") == mix {
				return ratioFromOutput(l.output, "bare")
			}
		}
		return 0, false
	}
	rpI, ok1 := idemRatio("dup=100")
	feI, ok2 := idemRatio("new=100")
	rpP, _ := paired("Replay")
	feP, _ := paired("FirstExecution")
	rpB, _ := ratio("Replay", 16)
	feB, _ := ratio("FirstExecution", 16)
	summary = append(summary,
		[]string{"memstore over loopback HTTP, 1 KiB: replay ≥ 0.85× the bare handler's throughput",
			fmt.Sprintf("idemload (16 clients) %.2f×; BenchmarkLoopback (16 clients) %.2f×; paired, 1 client %.2f×", rpI, rpB, rpP.med), verdict(ok1 && rpI >= 0.85)},
		[]string{"memstore over loopback HTTP, 1 KiB: first execution ≥ 0.75×",
			fmt.Sprintf("idemload (16 clients) %.2f×; BenchmarkLoopback (16 clients) %.2f×; paired, 1 client %.2f×", feI, feB, feP.med), verdict(ok2 && feI >= 0.75)})

	// GOMAXPROCS scaling.
	ms := res["memstore"]
	// scale is the throughput gained from GOMAXPROCS 1 to 2 by row base of r.
	scale := func(r *results, base string) (float64, bool) {
		a, ok1 := val(r, base, 1, "ns/op")
		b, ok2 := val(r, base, 2, "ns/op")
		return a.med / b.med, ok1 && ok2 && procs >= 2
	}
	acS, okA := scale(ms, "BenchmarkAcquireComplete/Parallel")
	arS, okR := scale(ms, "BenchmarkAcquireReplay/Parallel")
	// The bare handler shares nothing between goroutines: its gain from a
	// second CPU is what this machine gives at best in the same run.
	control := ""
	bare, bareOK := scale(res["middleware-parallel"], "BenchmarkMiddlewareParallel/Bare")
	if bareOK {
		control = fmt.Sprintf("; the bare handler, which shares nothing, ×%.2f in the same run", bare)
	}
	// A bare lock per shard is the least any store that locks a shard per
	// call pays.
	if ls, ok := scale(ms, "BenchmarkShardLocks"); ok {
		control += fmt.Sprintf("; shard locks alone (`BenchmarkShardLocks`) ×%.2f", ls)
	}
	summary = append(summary, []string{"memstore Acquire/Complete scale with GOMAXPROCS (-cpu 1,2)",
		fmt.Sprintf("throughput ×%.2f (acquire+complete), ×%.2f (replay) from 1 to 2 CPUs%s", acS, arS, control),
		scaleVerdict(okA && okR, acS, arS, bareOK, bare)})

	// Memory.
	mem := res["memstore-memory"]
	var memRows [][]string
	overheads := []float64{}
	for _, size := range []int{0, 1 << 10, 16 << 10} {
		base := fmt.Sprintf("BenchmarkRecordMemory/body=%d", size)
		per, ok1 := val(mem, base, procs, "bytes/record")
		ov, ok2 := val(mem, base, procs, "overhead-bytes/record")
		if ok2 {
			overheads = append(overheads, ov.med)
		}
		memRows = append(memRows, []string{sizeName(size), cell(per, ok1), cell(ov, ok2)})
	}
	flat := len(overheads) == 3 && math.Abs(overheads[2]-overheads[0]) < 32
	fe64, ok3 := val(mw, "BenchmarkMiddleware/FirstExecution/body=65536", procs, "B/op")
	rp64, ok4 := val(mw, "BenchmarkMiddleware/Replay/body=65536", procs, "B/op")
	extra := fe64.med - rp64.med
	oneBuffer := ok3 && ok4 && extra < 64<<10+8<<10
	summary = append(summary, []string{"Memory: one stored copy of the body; bytes/record proportional to the payload",
		fmt.Sprintf("first execution allocates %.1f KiB more than a replay for a 64 KiB body; %s B/record beyond the body at 0 B, 1 KiB and 16 KiB", extra/1024, joinNums(overheads)),
		verdict(oneBuffer && flat)})

	// Redis.
	rd := res["redis"]
	type redisRatio struct {
		first, replay       float64
		recFirst, recReplay float64
		ok                  bool
	}
	rr := map[int]redisRatio{}
	// overHTTP quotes idemload's time ratio to the floor for a Redis run
	// (requests over loopback HTTP, targets alternating round by round). It
	// is information beside the verdict, which comes from the benchmarks:
	// HTTP adds the same cost to both sides and so brings the ratio nearer 1.
	overHTTP := func(mix string, clients int) string {
		for _, l := range loads {
			if contains(l.args, "-redis") && argAfter(l.args, "-mix") == mix && argAfter(l.args, "-concurrency") == strconv.Itoa(clients) {
				if v, ok := ratioFromOutput(l.output, "floor"); ok && v > 0 {
					return fmt.Sprintf("; over HTTP (idemload) %.2f×", 1/v)
				}
			}
		}
		return ""
	}
	if rd != nil {
		for _, clients := range []int{1, 64} {
			get := func(name string) float64 {
				s, _ := val(rd, fmt.Sprintf("BenchmarkMiddlewareRedis/%s/body=1024/clients=%d", name, clients), procs, "ns/op")
				return s.med
			}
			f2, f1 := get("Floor2"), get("Floor1")
			if f1 > 0 && f2 > 0 {
				r := redisRatio{first: get("FirstExecution") / f2, replay: get("Replay") / f1, ok: true}
				if r2, r1 := get("Record2"), get("Record1"); r1 > 0 && r2 > 0 {
					r.recFirst, r.recReplay = r2/f2, r1/f1
				}
				rr[clients] = r
			}
		}
		for _, sbs := range sideBySide {
			r := res[sbs.step]
			get := func(name, unit string) (stat, bool) {
				return val(r, fmt.Sprintf("%s/%s/body=1024%s", sbs.bench, name, sbs.suffix), procs, unit)
			}
			f, ok1 := get("FirstExecution", "mw/floor")
			p, ok2 := get("Replay", "mw/floor")
			if !ok1 || !ok2 {
				continue
			}
			// parts names what the ratio is made of: the record floor's
			// and the store's own ratios to the floor.
			parts := func(name string) string {
				rec, _ := get(name, "record/floor")
				out := fmt.Sprintf("the record floor alone is %.2f×", rec.med)
				if st, ok := get(name, "store/floor"); ok {
					ms, _ := get(name, "mw/store")
					out += fmt.Sprintf(", the store's own calls %.2f× (the middleware adds %+.0f%% to them)", st.med, 100*(ms.med-1))
				}
				return out
			}
			seq, n := rr[sbs.clients], sbs.clients
			summary = append(summary,
				[]string{fmt.Sprintf("Redis, %d client(s), 1 KiB: first execution ≤ 1.25× (bare handler + 2 EVALSHA)", n),
					fmt.Sprintf("%s %s (rows run apart: %.2f×); %s%s", ratioCell(f), sbs.how, seq.first, parts("FirstExecution"), overHTTP("new=100", n)), verdict(f.med <= 1.25)},
				[]string{fmt.Sprintf("Redis, %d client(s), 1 KiB: replay ≤ 1.25× (1 EVALSHA)", n),
					fmt.Sprintf("%s %s (rows run apart: %.2f×); %s%s", ratioCell(p), sbs.how, seq.replay, parts("Replay"), overHTTP("dup=100", n)), verdict(p.med <= 1.25)})
			delete(rr, n)
		}
		for _, clients := range []int{1, 64} {
			r, ok := rr[clients]
			if !ok {
				continue
			}
			summary = append(summary,
				[]string{fmt.Sprintf("Redis, %d client(s), 1 KiB: first execution ≤ 1.25× (bare handler + 2 EVALSHA)", clients),
					fmt.Sprintf("%.2f× (time per request); the record floor alone is %.2f×%s", r.first, r.recFirst, overHTTP("new=100", clients)), verdict(r.ok && r.first <= 1.25)},
				[]string{fmt.Sprintf("Redis, %d client(s), 1 KiB: replay ≤ 1.25× (1 EVALSHA)", clients),
					fmt.Sprintf("%.2f×; the record floor alone is %.2f×%s", r.replay, r.recReplay, overHTTP("dup=100", clients)), verdict(r.ok && r.replay <= 1.25)})
		}
		summary = append(summary, []string{"Redis round trips: replay 1, first execution 2, conflict 1",
			"asserted per HTTP request by `TestHTTPRoundTrips` and per store call by `TestRoundTrips` (redisstore)", "**met** (tests)"})
	}

	// Key count.
	kcRows, kcSummary := keyCountRows(res, c.redis)
	summary = append(summary, kcSummary...)

	d.p("## Targets")
	d.p("")
	d.table([]string{"target", "measured", "verdict"}, summary)
	d.p("Why some targets are not met, and what would move them, is in [Findings](#findings).")
	d.p("")

	d.p("## Commands")
	d.p("")
	d.p("```sh")
	d.p("go run ./benchmarks/report                      # everything below; -quick for a fast check")
	d.p("go test -run '^$' -bench '^BenchmarkMiddleware$' -benchmem -count %d .", c.count)
	d.p("go test -run '^$' -bench '^BenchmarkMiddlewareParallel$' -benchmem -cpu 1,2 .")
	d.p("go test -run '^$' -bench 'AcquireComplete|AcquireReplay|ShardLocks' -benchmem -cpu 1,2 ./memstore/")
	d.p("go test -run '^$' -bench 'RecordMemory|KeyCount' -benchmem ./memstore/")
	d.p("go test -run '^$' -bench Loopback -benchmem ./benchmarks/load/")
	d.p("go test -run '^$' -bench 'MiddlewareRedis|KeyCount' -benchmem ./redisstore/   # starts a private redis-server; REDIS_ADDR overrides")
	d.p("go run ./cmd/idemload -duration 5s -concurrency 16 -mix new=70,dup=20,concdup=10 -body 1024 [-redis auto|127.0.0.1:6379]")
	d.p("```")
	d.p("")

	d.p("## memstore, in process")
	d.p("")
	d.p("`BenchmarkMiddleware` (root package): one request through the middleware on memstore, no network, beside the bare handler. FirstExecution uses a fresh key per request (the store grows by b.N records); Replay repeats a completed key; Conflict hits a key whose handler is still running; Mismatch sends another body under a completed key.")
	d.p("")
	d.table([]string{"case", "body", "ns/op", "B/op", "allocs/op", "allocs above bare"}, rows)

	var parRows [][]string
	mp := res["middleware-parallel"]
	for _, name := range []string{"Bare", "FirstExecution", "Replay", "Conflict", "Mismatch"} {
		base := "BenchmarkMiddlewareParallel/" + name
		a, ok1 := val(mp, base, 1, "ns/op")
		b, ok2 := val(mp, base, 2, "ns/op")
		sp := "–"
		if ok1 && ok2 {
			sp = fmt.Sprintf("×%.2f", a.med/b.med)
		}
		parRows = append(parRows, []string{name, cell(a, ok1), cell(b, ok2), sp})
	}
	d.p("`BenchmarkMiddlewareParallel` (1 KiB), ns/op at GOMAXPROCS 1 and 2 and the throughput gained:")
	d.p("")
	d.table([]string{"case", "-cpu 1", "-cpu 2", "throughput 1→2"}, parRows)

	var msRows [][]string
	for _, base := range []string{"BenchmarkAcquireComplete/Serial", "BenchmarkAcquireComplete/Parallel", "BenchmarkAcquireReplay/Serial", "BenchmarkAcquireReplay/Parallel", "BenchmarkAcquireReplay/ParallelSameKey", "BenchmarkShardLocks"} {
		a, ok1 := val(ms, base, 1, "ns/op")
		b, ok2 := val(ms, base, 2, "ns/op")
		al, ok3 := val(ms, base, 2, "allocs/op")
		sp := "–"
		if ok1 && ok2 {
			sp = fmt.Sprintf("×%.2f", a.med/b.med)
		}
		msRows = append(msRows, []string{strings.TrimPrefix(base, "Benchmark"), cell(a, ok1), cell(b, ok2), sp, cell(al, ok3)})
	}
	d.p("memstore alone (`./memstore`), ns/op at GOMAXPROCS 1 and 2:")
	d.p("")
	d.table([]string{"benchmark", "-cpu 1", "-cpu 2", "throughput 1→2", "allocs/op"}, msRows)

	d.p("### Memory per record")
	d.p("")
	d.p("`BenchmarkRecordMemory`: heap held per COMPLETE record (20 000 records, a Content-Type and a Location header), and the part beyond the body (key, token, fingerprint, record, and the status and headers, which memstore keeps as one block of bytes that the garbage collector does not scan). That part is constant, so a record costs its body plus about that much. The stored body is the recorder's capture buffer itself: at 64 KiB a first execution allocates %.1f KiB more than a replay (which reads the same request body), i.e. the one stored buffer and no second copy.", extra/1024)
	d.p("")
	d.table([]string{"body", "bytes/record", "beyond the body, bytes/record"}, memRows)

	d.p("## memstore, over loopback HTTP")
	d.p("")
	d.p("`BenchmarkLoopback` (`./benchmarks/load`): whole HTTP requests from an in-process client to a server on 127.0.0.1, 1 KiB response. Throughput is 10⁹ / ns/op. `BenchmarkLoopbackPaired` alternates a bare and a middleware request from one client, so both see the same background load, and reports bare time / middleware time.")
	d.p("")
	var lbRows [][]string
	for _, clients := range []int{1, 16} {
		for _, name := range []string{"Bare", "FirstExecution", "Replay"} {
			ns, ok := val(lb, fmt.Sprintf("BenchmarkLoopback/%s/clients=%d", name, clients), procs, "ns/op")
			r, rok := ratio(name, clients)
			rs := "–"
			if rok {
				rs = fmt.Sprintf("%.2f×", r)
			}
			lbRows = append(lbRows, []string{name, fmt.Sprint(clients), cell(ns, ok), fmt.Sprintf("%.0f", 1e9/ns.med), rs})
		}
	}
	d.table([]string{"case", "clients", "ns/op", "req/s", "throughput vs bare"}, lbRows)
	var pRows [][]string
	for _, name := range []string{"FirstExecution", "Replay"} {
		base := fmt.Sprintf("BenchmarkLoopbackPaired/%s/clients=1", name)
		b, ok1 := val(lb, base, procs, "bare-µs/req")
		m2, ok2 := val(lb, base, procs, "mw-µs/req")
		r, ok3 := val(lb, base, procs, "throughput-ratio")
		pRows = append(pRows, []string{name, cell(b, ok1), cell(m2, ok2), cell(r, ok3)})
	}
	d.table([]string{"paired, 1 client", "bare µs/req", "middleware µs/req", "throughput ratio"}, pRows)

	if rd != nil {
		d.p("## Redis")
		d.p("")
		d.p("`BenchmarkMiddlewareRedis` (`./redisstore`): one request through the middleware on redisstore, in process (no HTTP), against a private redis-server on loopback. The floors run the same handler with raw EVALSHA round trips of `return {1}`: **Floor1** one (what a replay, conflict or mismatch needs at least), **Floor2** one before and one after the handler (a first execution). The record floors do the least any store that keeps its records in Redis hashes must do, with no checks at all: **Record1** is one EVALSHA that reads a stored payload (HMGET meta, body) and writes it as the response; **Record2** is the handler between one EVALSHA that creates a record (HSET, PEXPIRE) and one that stores the payload in it (HSET, PEXPIRE). **Store1** and **Store2** call the store's own `Acquire` (and, for a first execution, the handler and `Complete`) without the middleware: what the store's scripts and its Go side cost, before the middleware parses the key, fingerprints the request, records the response and runs the heartbeat. clients=64 runs 64 goroutines over one go-redis client (PoolSize 128). ns/op is wall time per request (the inverse of throughput); p50/p99 are per-request latencies; proc and redis CPU are the CPU time the benchmark process and redis-server spent per request (both share the machine's cores, so with 64 clients their sum bounds throughput). The ratios compare with the matching floor (target ≤ 1.25) and with the matching record floor.")
		d.p("")
		for _, size := range []int{0, 1 << 10, 64 << 10} {
			var rrows [][]string
			for _, clients := range []int{1, 64} {
				for _, name := range []string{"Bare", "Floor1", "Floor2", "Record1", "Record2", "Store1", "Store2", "FirstExecution", "Replay", "Conflict", "Mismatch"} {
					base := fmt.Sprintf("BenchmarkMiddlewareRedis/%s/body=%d/clients=%d", name, size, clients)
					ns, ok := val(rd, base, procs, "ns/op")
					p50, ok1 := val(rd, base, procs, "p50-µs")
					p99, ok2 := val(rd, base, procs, "p99-µs")
					al, ok3 := val(rd, base, procs, "allocs/op")
					pc, ok4 := val(rd, base, procs, "proc-cpu-µs/op")
					sc, ok5 := val(rd, base, procs, "redis-cpu-µs/op")
					ratio := func(floor string) string {
						f, fok := val(rd, fmt.Sprintf("BenchmarkMiddlewareRedis/%s/body=%d/clients=%d", floor, size, clients), procs, "ns/op")
						if !fok || !ok {
							return ""
						}
						return fmt.Sprintf("%.2f× %s", ns.med/f.med, floor)
					}
					rs, rec := "", ""
					switch name {
					case "FirstExecution":
						rs, rec = ratio("Floor2"), ratio("Record2")
					case "Record2":
						rs = ratio("Floor2")
					case "Record1":
						rs = ratio("Floor1")
					case "Store2":
						rs, rec = ratio("Floor2"), ratio("Record2")
					case "Store1":
						rs, rec = ratio("Floor1"), ratio("Record1")
					case "Replay":
						rs, rec = ratio("Floor1"), ratio("Record1")
					case "Conflict", "Mismatch":
						rs = ratio("Floor1")
					}
					rps := "–"
					if ok {
						rps = fmt.Sprintf("%.0f", 1e9/ns.med)
					}
					rrows = append(rrows, []string{name, fmt.Sprint(clients), cell(ns, ok), rps, cell(p50, ok1), cell(p99, ok2), cell(pc, ok4), cell(sc, ok5), cell(al, ok3), rs, rec})
				}
			}
			d.p("Body %s:", sizeName(size))
			d.p("")
			d.table([]string{"case", "clients", "ns/op", "req/s", "p50 µs", "p99 µs", "proc CPU µs", "redis CPU µs", "allocs/op", "vs floor", "vs record floor"}, rrows)
		}
		for _, sbs := range sideBySide {
			rp := res[sbs.step]
			if rp == nil {
				continue
			}
			d.p("### " + sbs.title)
			d.p("")
			d.p(sbs.text)
			d.p("")
			var prow [][]string
			for _, name := range []string{"Replay", "FirstExecution"} {
				base := fmt.Sprintf("%s/%s/body=1024%s", sbs.bench, name, sbs.suffix)
				cases := "Floor1, Record1, Store1"
				if name == "FirstExecution" {
					cases = "Floor2, Record2, Store2"
				}
				row := []string{name + " (" + cases + ")"}
				for _, unit := range []string{"floor-µs/req", "record-µs/req", "store-µs/req", "mw-µs/req", "mw/floor", "record/floor", "store/floor", "mw/store"} {
					v, ok := val(rp, base, procs, unit)
					row = append(row, cell(v, ok))
				}
				prow = append(prow, row)
			}
			d.table([]string{fmt.Sprintf("1 KiB, %d client(s)", sbs.clients), "floor µs/req", "record floor µs/req", "store alone µs/req", "middleware µs/req", "middleware / floor", "record floor / floor", "store alone / floor", "middleware / store alone"}, prow)
		}
		if rc := res["redis-cluster"]; rc != nil {
			const base = "BenchmarkClusterPublish"
			w, ok1 := val(rc, base, procs, "cpu-µs/fe@watched")
			a, ok2 := val(rc, base, procs, "cpu-µs/fe@always")
			r, ok3 := val(rc, base, procs, "watched/always")
			ww, ok4 := val(rc, base, procs, "wall-µs/fe@watched")
			wa, ok5 := val(rc, base, procs, "wall-µs/fe@always")
			if ok1 || ok2 {
				d.p("### Cluster: publishing only for watched records")
				d.p("")
				d.p("`BenchmarkClusterPublish` (`./redisstore`) starts a 3-master Cluster on loopback and runs first executions (Acquire, then Complete with a 1 KiB body) from 32 goroutines, in phases that alternate between the store's complete, which publishes only when a waiter has marked the record, and a copy of it that publishes every time. A Cluster sends every PUBLISH to every node, so the second costs all three nodes CPU time for each completion. CPU is the sum over the nodes of redis-server's user and system time per first execution.")
				d.p("")
				d.table([]string{"complete", "cluster CPU µs per first execution", "wall µs per first execution"}, [][]string{
					{"publishes when watched (the store)", cell(w, ok1), cell(ww, ok4)},
					{"publishes every time", cell(a, ok2), cell(wa, ok5)},
					{"ratio", cell(r, ok3), ""},
				})
			}
		}
		if scripts != nil {
			d.p("### Server time per script")
			d.p("")
			d.p("From the change in `INFO commandstats` (EVALSHA usec / calls) over 3000 calls of each edge, one at a time, on a private server. This is the time redis-server spends inside the script; the floor script costs the fixed overhead of EVALSHA, and each record floor row is the least a store keeping hash records spends on the same step, checking nothing (the scripts of Record1 and Record2 above).")
			d.p("")
			var srows [][]string
			for _, s := range scripts.rows {
				srows = append(srows, []string{s.name, fmt.Sprint(s.calls), s.commands, fmt.Sprintf("%.1f", s.usec)})
			}
			d.table([]string{"script", "commands inside", "which", "server µs per call"}, srows)
		}
	}

	if peers != "" {
		d.p("## Peers")
		d.p("")
		d.p("`cd benchmarks/peers && go run .` (a module of its own, so the peers stay out of this module's dependencies) serves each stack's bare handler and the same handler behind that stack's idempotency middleware on loopback, drives both with the same client, first with new keys and then with completed keys, and reports the middleware's throughput as a fraction of its own bare handler's. The stacks have different HTTP servers, so the fraction, not the absolute rate, compares the middleware. The peer measured is fiber's `middleware/idempotency` (on fasthttp, in-memory storage and locker), the only Go idempotency middleware the module proxy here serves. It does less per request than this middleware: it keeps no request fingerprint, so a reused key with another request replays the first response instead of answering 422; it stores 5xx responses as well, so a retry after a server error gets the error again; and its default lock works within one process, so a duplicate waits for the original instead of getting 409, and two processes can run the same key at once. The storage key is the client's key as sent.")
		d.p("")
		d.p("```")
		d.p("%s", strings.TrimRight(peers, "\n"))
		d.p("```")
		d.p("")
	}

	d.p("## Key count")
	d.p("")
	d.p("`BenchmarkKeyCount` in `./memstore` and `./redisstore`: store operations of one request (no HTTP) with 10³ to 10⁶ live COMPLETE records. Replay looks up a record picked at random among them; FirstExecution is Acquire of a new key then Complete. memstore runs the sizes one after another. Redis runs them in lockstep: databases 0 to 3 of one private server hold the four sizes, and each op makes the request once in each, in a rotating order, so that all sizes see the same background load (one size after another, the rows moved by tens of per cent with the machine's load). memstore records carry a 14-byte body; Redis records an empty body and one header, so that the 1.1 million of them fit in about 250 MB of redis-server memory (a 1 KiB body would need about 1.5 GB) — the body size does not change how either store finds a key.")
	d.p("")
	d.p("![cost per request against live records](benchmarks/keycount.svg)")
	d.p("")
	d.table([]string{"store", "case", "10³", "10⁴", "10⁵", "10⁶", "max/min"}, kcRows)

	d.p("## idemload")
	d.p("")
	d.p("`go run ./cmd/idemload` with the flags shown: an HTTP server on 127.0.0.1 with the middleware (memstore, or Redis with `-redis`), the bare handler and, for Redis, the floor (bare handler + the raw EVALSHA round trips the request needs at best) measured in the same run with the same clients. Progress lines are left out.")
	d.p("")
	for _, l := range loads {
		d.p("```")
		d.p("$ idemload %s", strings.Join(l.args, " "))
		d.p("%s", l.output)
		d.p("```")
		d.p("")
	}

	d.p("## Findings")
	d.p("")
	for _, f := range findings {
		d.p("%s", f)
		d.p("")
	}
	return d.String()
}

func orDash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

func argAfter(args []string, flag string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == flag {
			return args[i+1]
		}
	}
	return ""
}

// ratioFromOutput reads "0.91x bare" from the middleware line of idemload
// output.
func ratioFromOutput(out, target string) (float64, bool) {
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "middleware ") {
			continue
		}
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if strings.TrimSuffix(f[i+1], ",") == target && strings.HasSuffix(f[i], "x") {
				var v float64
				if _, err := fmt.Sscanf(strings.TrimSuffix(f[i], "x"), "%g", &v); err == nil {
					return v, true
				}
			}
		}
	}
	return 0, false
}

func joinNums(vs []float64) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = fmt.Sprintf("%.0f", v)
	}
	return strings.Join(parts, " / ")
}

var keyCounts = []int{1_000, 10_000, 100_000, 1_000_000}

// keyCountRows returns the key-count table and its verdicts. A curve is
// flat when its rise from 10³ to 10⁶ keys is within 10% of what a request
// costs anyway: for memstore a bare request over loopback HTTP (the store
// call alone is a few hundred nanoseconds, so cache misses on a larger map
// show as a large ratio of a small number), for Redis the 10³ value itself.
func keyCountRows(res map[string]*results, redis bool) (rows, summary [][]string) {
	stores := []struct{ name, step, unit string }{{"memstore", "memstore-keycount", "ns"}}
	if redis {
		stores = append(stores, struct{ name, step, unit string }{"Redis", "redis-keycount", "µs"})
	}
	httpReq, httpOK := val(res["loopback"], "BenchmarkLoopback/Bare/clients=1", procs, "ns/op")
	for _, st := range stores {
		ok := true
		var parts []string
		for _, name := range []string{"Replay", "FirstExecution"} {
			row := []string{st.name, name + " (" + st.unit + "/op)"}
			lo, hi := math.Inf(1), 0.0
			first := math.NaN()
			for _, n := range keyCounts {
				s, sok := keyCountVal(res[st.step], name, n)
				row = append(row, cell(scaleStat(s, st.unit), sok))
				if sok {
					lo, hi = min(lo, s.med), max(hi, s.med)
					if math.IsNaN(first) {
						first = s.med
					}
				}
			}
			row = append(row, fmt.Sprintf("%.2f", hi/lo))
			rows = append(rows, row)
			rise := hi - first
			if st.name == "memstore" {
				ok = ok && httpOK && rise <= 0.1*httpReq.med
				parts = append(parts, fmt.Sprintf("%s +%.0f ns (%.1f%% of a %.0f µs loopback request)", name, rise, 100*rise/httpReq.med, httpReq.med/1000))
			} else {
				ok = ok && rise <= 0.1*first
				parts = append(parts, fmt.Sprintf("%s %+.0f%%", name, 100*rise/first))
			}
		}
		summary = append(summary, []string{fmt.Sprintf("%s: cost per request flat from 10³ to 10⁶ live keys", st.name),
			"largest rise over the 10³ value: " + strings.Join(parts, "; "), verdict(ok)})
	}
	return rows, summary
}

// keyCountVal returns the time of one request (ns) of case name at n live
// keys: from the row of that size (memstore's BenchmarkKeyCount runs the
// sizes one after another) or from the size's metric of the case's row
// (redisstore's runs them in lockstep).
func keyCountVal(r *results, name string, n int) (stat, bool) {
	if s, ok := val(r, fmt.Sprintf("BenchmarkKeyCount/%s/keys=%d", name, n), procs, "ns/op"); ok {
		return s, true
	}
	return val(r, "BenchmarkKeyCount/"+name, procs, fmt.Sprintf("ns/req@keys=%d", n))
}

func scaleStat(s stat, unit string) stat {
	if unit == "µs" {
		s.med /= 1000
	}
	return s
}

func keyCountPanels(res map[string]*results, redis bool) []panel {
	x := make([]float64, len(keyCounts))
	for i, n := range keyCounts {
		x[i] = float64(n)
	}
	mk := func(step, title, unit string, div float64) panel {
		p := panel{title: title, yLabel: unit + " per request", x: x}
		for i, name := range []string{"Replay", "FirstExecution"} {
			s := series{name: map[string]string{"Replay": "replay", "FirstExecution": "first execution"}[name], color: []string{"#1f77b4", "#d62728"}[i]}
			for _, n := range keyCounts {
				v, ok := keyCountVal(res[step], name, n)
				if ok {
					s.y = append(s.y, v.med/div)
				} else {
					s.y = append(s.y, math.NaN())
				}
			}
			p.series = append(p.series, s)
		}
		return p
	}
	panels := []panel{mk("memstore-keycount", "memstore (store calls, in process)", "ns", 1)}
	if redis {
		panels = append(panels, mk("redis-keycount", "Redis (store calls, loopback)", "µs", 1000))
	}
	return panels
}
