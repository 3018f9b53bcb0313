package main

import "fmt"

// The benchmarks of the Redis page.
const (
	benchMiddlewareRedis = "BenchmarkMiddlewareRedis"
	benchRedisPaired     = "BenchmarkMiddlewareRedisPaired"
	benchRedisPhased     = "BenchmarkMiddlewareRedisPhased"
	benchClusterPublish  = "BenchmarkClusterPublish"
)

// redisPkg is the package of the Redis benchmarks, in the benchmarks
// module.
const redisPkg = "./redisbench/"

var (
	redisStep  = step{name: "redis", tools: true, pkg: redisPkg, benches: []string{benchMiddlewareRedis}, benchtime: "0.5s", quick: "2000x", redis: true}
	pairedStep = step{name: "redis-paired", tools: true, pkg: redisPkg, benches: []string{benchRedisPaired}, benchtime: "3000x", quick: "500x", redis: true}
	// An op of BenchmarkMiddlewareRedisPhased is 4 phases of 64×25
	// requests; one of BenchmarkClusterPublish 2 phases of 32×25 first
	// executions.
	phasedStep  = step{name: "redis-phased", tools: true, pkg: redisPkg, benches: []string{benchRedisPhased}, benchtime: "20x", quick: "2x", redis: true}
	clusterStep = step{name: "redis-cluster", tools: true, pkg: redisPkg, benches: []string{benchClusterPublish}, benchtime: "10x", quick: "2x", redis: true}
)

var redisPage = page{
	file:    "redis.md",
	title:   "Redis",
	about:   "the middleware on redisstore beside its floors, with one client and 64, in rows run apart, in lockstep and in alternating phases; publishing on a Cluster; server time per script",
	steps:   []*step{&redisStep, &pairedStep, &phasedStep, &clusterStep},
	targets: redisTargets,
	body:    redisBody,
}

// redisCase is a case of BenchmarkMiddlewareRedis and what its time is
// compared with: the floor (raw EVALSHA round trips), the record floor and,
// for the middleware's cases, the store alone ("" for none).
type redisCase struct{ name, floor, record, store string }

// redisCases are the cases of BenchmarkMiddlewareRedis, in table order.
var redisCases = []redisCase{
	{"Bare", "", "", ""},
	{"Floor1", "", "", ""},
	{"Floor2", "", "", ""},
	{"Record1", "Floor1", "", ""},
	{"Record2", "Floor2", "", ""},
	{"Store1", "Floor1", "Record1", ""},
	{"Store2", "Floor2", "Record2", ""},
	{"FirstExecution", "Floor2", "Record2", "Store2"},
	{"Replay", "Floor1", "Record1", "Store1"},
	{"Conflict", "Floor1", "", ""},
	{"Mismatch", "Floor1", "", ""},
}

var (
	redisSizes   = []int{0, 1 << 10, 64 << 10}
	redisClients = []int{1, 64}
)

// redisJudged are the middleware's cases the targets judge, each with its
// floor and the idemload mix that sends the same requests over HTTP.
var redisJudged = []struct{ name, what, floor, mix string }{
	{"FirstExecution", "first execution", "bare handler + an EVALSHA that writes a hash record with its expiry, and one that stores its payload", "new=100"},
	{"Replay", "replay", "an EVALSHA that reads a hash record's payload", "dup=100"},
}

// redisLimit is the target for clients: the middleware's time per request
// at most this many times its record floor's (the least a store keeping
// its records in Redis hashes must do). With 64 clients the two processes
// share the two cores, so the ratio is one of CPU time and the limit is
// looser.
func redisLimit(clients int) float64 {
	if clients > 1 {
		return 1.35
	}
	return 1.25
}

// A sideBySideBench is a Redis benchmark that measures the middleware and
// its floors under the same background load, with 1 KiB bodies.
type sideBySideBench struct {
	step        *step
	suffix      string // of its rows: <benchmark>/<case>/body=1024<suffix>
	clients     int
	how         string // how the rows were run, for the targets table
	title, text string
}

// get returns the median of unit in the row of case name.
func (s *sideBySideBench) get(ms *measured, name, unit string) (stat, bool) {
	return val(ms.of(s.step), fmt.Sprintf("%s/%s/body=%d%s", s.step.benches[0], name, 1<<10, s.suffix), procs, unit)
}

// sideBySide are the side-by-side benchmarks, one per number of clients.
// Where one was run, the targets take their ratios for its number of
// clients from it: the rows of BenchmarkMiddlewareRedis run seconds apart,
// under different load.
var sideBySide = []*sideBySideBench{
	{&pairedStep, "", 1, "in lockstep", "One client, in lockstep",
		"`" + benchRedisPaired + "`: one client sends, op after op, one request to the floor, one to the record floor, one to the store alone and one through the middleware, in an order that rotates, so that the four see the same background load; the table gives the mean time of each and the ratios to the floor. The one-client rows above run seconds apart, and on this shared machine the load changes between them by more than the differences measured; the targets take the one-client ratios from here."},
	{&phasedStep, "/clients=64", 64, "in alternating phases", "64 clients, in alternating phases",
		"`" + benchRedisPhased + "`: each op runs four phases, one for the floor, one for the record floor, one for the store alone and one for the middleware, in an order that rotates; in each phase 64 goroutines send 25 requests each. Phases last a fraction of a second, so the four see the same background load; the table gives the time per request of each (wall time of its phases over their requests: the inverse of throughput) and the ratios to the floor. The targets take the 64-client ratios from here."},
}

// redisRow is the name of a row of BenchmarkMiddlewareRedis.
func redisRow(name string, size, clients int) string {
	return fmt.Sprintf("%s/%s/body=%d/clients=%d", benchMiddlewareRedis, name, size, clients)
}

// redisRatio is the time per request of case name over that of case than
// in BenchmarkMiddlewareRedis.
func (ms *measured) redisRatio(name, than string, size, clients int) (float64, bool) {
	x, ok1 := val(ms.of(&redisStep), redisRow(name, size, clients), procs, "ns/op")
	y, ok2 := val(ms.of(&redisStep), redisRow(than, size, clients), procs, "ns/op")
	return x.med / y.med, ok1 && ok2
}

func redisTargets(ms *measured) [][]string {
	if ms.of(&redisStep) == nil {
		return nil
	}
	var rows [][]string
	for _, clients := range redisClients {
		for _, j := range redisJudged {
			target := fmt.Sprintf("Redis, %d client(s), 1 KiB: %s ≤ %.2f× the record floor (%s)", clients, j.what, redisLimit(clients), j.floor)
			rows = append(rows, ms.redisTarget(target, redisCaseNamed(j.name), j.mix, clients))
		}
	}
	rows = append(rows, ms.scriptTargets()...)
	if len(ms.loads) > 0 {
		rows = append(rows, ms.httpRecordTargets()...)
		rows = append(rows, ms.clientHearsTarget())
	}
	return append(rows, []string{"Redis round trips: replay 1, first execution 2, conflict 1",
		"asserted per HTTP request by `TestHTTPRoundTrips` and per store call by `TestRoundTrips` (redisstore)", "**met** (tests)"})
}

// httpRecordTargets judges the one-client Redis targets at the HTTP level:
// the middleware's time per request over loopback HTTP beside the record
// floor's over HTTP (idemload's recordfloor target: the bare handler with
// the record floor's scripts), in the same run, with the same client.
func (ms *measured) httpRecordTargets() [][]string {
	var rows [][]string
	for _, j := range redisJudged {
		target := fmt.Sprintf("Redis, 1 client, 1 KiB, over HTTP: %s ≤ %.2f× the record floor over HTTP (idemload's `recordfloor`)", j.what, redisLimit(1))
		v, ok := ms.idemloadRatio(true, j.mix, 1, "recordfloor")
		if !ok || v <= 0 {
			rows = append(rows, []string{target, "not measured in this run", "–"})
			continue
		}
		rows = append(rows, []string{target, fmt.Sprintf("%.2f× (time per request: the inverse of idemload's throughput ratio, the median of its rounds)", 1/v), verdict(1/v <= redisLimit(1))})
	}
	return rows
}

// redisTarget judges, for target, the middleware's case c with clients
// clients against its floor: from the side-by-side benchmark for that many
// clients where it was run, else from the rows of BenchmarkMiddlewareRedis.
// The ratio over HTTP (idemload with mix), where HTTP adds the same cost to
// both sides, is quoted beside it.
func (ms *measured) redisTarget(target string, c redisCase, mix string, clients int) []string {
	const size = 1 << 10
	overHTTP := ""
	if v, ok := ms.idemloadRatio(true, mix, clients, "floor"); ok && v > 0 {
		overHTTP = fmt.Sprintf("; over HTTP (idemload) %.2f×", 1/v)
	}
	apart, apartOK := ms.redisRatio(c.name, c.floor, size, clients)
	apartCell := "–"
	if apartOK {
		apartCell = fmt.Sprintf("%.2f×", apart)
	}
	for _, sbs := range sideBySide {
		mw, ok1 := sbs.get(ms, c.name, "mw/floor")
		rec, ok2 := sbs.get(ms, c.name, "record/floor")
		if sbs.clients != clients || !ok1 || !ok2 {
			continue
		}
		r := mw.med / rec.med // the middleware over the record floor
		parts := fmt.Sprintf("against the raw EVALSHA floor: the middleware %.2f×, the record floor %.2f×", mw.med, rec.med)
		if st, ok := sbs.get(ms, c.name, "store/floor"); ok {
			mwStore, _ := sbs.get(ms, c.name, "mw/store")
			parts += fmt.Sprintf(", the store's own calls %.2f× (the middleware adds %+.0f%% to them)", st.med, 100*(mwStore.med-1))
		}
		return []string{target, fmt.Sprintf("%.2f× %s (rows run apart: %s against the raw floor); %s%s", r, sbs.how, apartCell, parts, overHTTP), verdict(r <= redisLimit(clients))}
	}
	rec, _ := ms.redisRatio(c.record, c.floor, size, clients)
	r := apart / rec
	return []string{target, fmt.Sprintf("%.2f× (time per request, rows run apart); the record floor alone is %.2f× the raw floor%s", r, rec, overHTTP), verdict(apartOK && rec > 0 && r <= redisLimit(clients))}
}

func redisBody(ms *measured, d *doc) {
	if ms.of(&redisStep) == nil {
		d.para("Not measured in this run: there was no redis-server on PATH and no REDIS_ADDR.")
		return
	}
	ms.redisRowsSection(d)
	for _, sbs := range sideBySide {
		ms.sideBySideSection(d, sbs)
	}
	ms.clusterSection(d)
	ms.scriptsSection(d)
}

func (ms *measured) sideBySideSection(d *doc, sbs *sideBySideBench) {
	if ms.of(sbs.step) == nil {
		return
	}
	d.heading(2, sbs.title)
	d.commands(ms.c, sbs.step)
	d.para("%s", sbs.text)
	var rows [][]string
	for _, j := range redisJudged {
		c := redisCaseNamed(j.name)
		row := []string{fmt.Sprintf("%s (%s, %s, %s)", c.name, c.floor, c.record, c.store)}
		for _, unit := range []string{"floor-µs/req", "record-µs/req", "store-µs/req", "mw-µs/req", "mw/floor", "record/floor", "store/floor", "mw/store"} {
			row = append(row, cell(sbs.get(ms, c.name, unit)))
		}
		rows = append(rows, row)
	}
	d.table([]string{fmt.Sprintf("1 KiB, %d client(s)", sbs.clients), "floor µs/req", "record floor µs/req", "store alone µs/req", "middleware µs/req", "middleware / floor", "record floor / floor", "store alone / floor", "middleware / store alone"}, rows)
}

// redisCaseNamed returns the case of BenchmarkMiddlewareRedis called name.
func redisCaseNamed(name string) redisCase {
	for _, c := range redisCases {
		if c.name == name {
			return c
		}
	}
	panic("no case " + name + " in " + benchMiddlewareRedis)
}

func (ms *measured) redisRowsSection(d *doc) {
	d.heading(2, "One request in process")
	d.commands(ms.c, &redisStep)
	d.para("`%s`: one request through the middleware on redisstore, in process (no HTTP), against a private redis-server on loopback. The floors run the same handler with raw EVALSHA round trips of `return {1}`: **Floor1** one (what a replay, conflict or mismatch needs at least), **Floor2** one before and one after the handler (a first execution). The record floors do the least any store that keeps its records in Redis hashes must do, with no checks at all: **Record1** is one EVALSHA that reads a stored payload (HMGET meta, body) and writes it as the response; **Record2** is the handler between one EVALSHA that creates a record (HSET, PEXPIRE) and one that stores the payload in it (HSET, PEXPIRE). **Store1** and **Store2** call the store's own `Acquire` (and, for a first execution, the handler and `Complete`) without the middleware: what the store's scripts and its Go side cost, before the middleware parses the key, fingerprints the request, records the response and runs the heartbeat. clients=64 runs 64 goroutines over one go-redis client (PoolSize 128). ns/op is wall time per request (the inverse of throughput); p50/p99 are per-request latencies; proc and redis CPU are the CPU time the benchmark process and redis-server spent per request (both share the machine's cores, so with 64 clients their sum bounds throughput). The ratios compare with the matching floor and with the matching record floor (the targets: ≤ %.2f× the record floor with one client, ≤ %.2f× with 64).", benchMiddlewareRedis, redisLimit(1), redisLimit(64))
	rd := ms.of(&redisStep)
	for _, size := range redisSizes {
		var rows [][]string
		for _, clients := range redisClients {
			for _, c := range redisCases {
				base := redisRow(c.name, size, clients)
				ns, ok := val(rd, base, procs, "ns/op")
				ratio := func(than string) string {
					if r, rok := ms.redisRatio(c.name, than, size, clients); than != "" && rok {
						return fmt.Sprintf("%.2f× %s", r, than)
					}
					return ""
				}
				rps := "–"
				if ok {
					rps = fmt.Sprintf("%.0f", 1e9/ns.med)
				}
				row := []string{c.name, fmt.Sprint(clients), cell(ns, ok), rps}
				for _, unit := range []string{"p50-µs", "p99-µs", "proc-cpu-µs/op", "redis-cpu-µs/op", "allocs/op"} {
					row = append(row, cell(val(rd, base, procs, unit)))
				}
				rows = append(rows, append(row, ratio(c.floor), ratio(c.record)))
			}
		}
		d.para("Body %s:", sizeName(size))
		d.table([]string{"case", "clients", "ns/op", "req/s", "p50 µs", "p99 µs", "proc CPU µs", "redis CPU µs", "allocs/op", "vs floor", "vs record floor"}, rows)
	}
}

func (ms *measured) clusterSection(d *doc) {
	rc := ms.of(&clusterStep)
	w, ok1 := val(rc, benchClusterPublish, procs, "cpu-µs/fe@watched")
	a, ok2 := val(rc, benchClusterPublish, procs, "cpu-µs/fe@always")
	if !ok1 && !ok2 {
		return
	}
	d.heading(2, "Cluster: publishing only for watched records")
	d.commands(ms.c, &clusterStep)
	d.para("`%s` starts a 3-master Cluster on loopback and runs first executions (Acquire, then Complete with a 1 KiB body) from 32 goroutines, in phases that alternate between the store's complete, which publishes only when a waiter has marked the record, and a copy of it that publishes every time. A Cluster sends every PUBLISH to every node, so the second costs all three nodes CPU time for each completion. CPU is the sum over the nodes of redis-server's user and system time per first execution.", benchClusterPublish)
	d.table([]string{"complete", "cluster CPU µs per first execution", "wall µs per first execution"}, [][]string{
		{"publishes when watched (the store)", cell(w, ok1), cell(val(rc, benchClusterPublish, procs, "wall-µs/fe@watched"))},
		{"publishes every time", cell(a, ok2), cell(val(rc, benchClusterPublish, procs, "wall-µs/fe@always"))},
		{"ratio", cell(val(rc, benchClusterPublish, procs, "watched/always")), ""},
	})
}

func (ms *measured) scriptsSection(d *doc) {
	if ms.scripts == nil {
		return
	}
	d.heading(2, "Server time per script")
	d.para("Measured by the report itself (`measureScripts`), kept in `report.json`: the change in `INFO commandstats` (EVALSHA usec / calls) over %d calls of each edge, one at a time, on a private server, with the edges interleaved in batches of %d keys; each row is the median of %d such passes. This is the time redis-server spends inside the script; the floor script costs the fixed overhead of EVALSHA, and each record floor row is the least a store keeping hash records spends on the same step, checking nothing (the scripts of Record1 and Record2 above).", scriptCalls, scriptBatch, scriptPasses)
	var rows [][]string
	for _, s := range ms.scripts.rows {
		rows = append(rows, []string{s.name, fmt.Sprint(s.calls), s.commands, fmt.Sprintf("%.1f", s.usec)})
	}
	d.table([]string{"script", "commands inside", "which", "server µs per call"}, rows)
}
