package main

import (
	"embed"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/template"
)

// templates are the pages' Markdown, with placeholders for the numbers.
//
//go:embed BENCHMARKS.md.tmpl details.md.tmpl
var templates embed.FS

// The targets: the middleware's time per request within floorLimit times
// its record floor's; a cost per request that rises by at most flatLimit
// from 10³ to 10⁶ live records.
const (
	floorLimit = 1.25
	flatLimit  = 0.10
	// defaultLimit: on Redis, the middleware over a go-redis client at its
	// default options within this of the same over one with
	// ContextTimeoutEnabled.
	defaultLimit = 1.05
)

// notMeasured is the cell of a row whose numbers the run lacks.
const notMeasured = "not measured in this run | –"

// writePages renders BENCHMARKS.md and results/details.md.
func writePages(d dirs) error {
	machine := readMachine(d)
	data := map[string]any{"machine": machine, "reruns": reruns(machine), "v": values(d)}
	funcs := template.FuncMap{
		"benchstat": func(name string, args ...string) (string, error) {
			out, err := d.benchstat("text", name, args...)
			return "```\n$ benchstat " + strings.Join(append(args, name), " ") + "\n" + strings.TrimRight(out, "\n") + "\n```", err
		},
		"command": func(name string) string {
			for _, s := range steps(false) {
				if s.name == name {
					return "`" + s.command() + "`"
				}
			}
			return "`?`"
		},
	}
	for file, path := range map[string]string{"BENCHMARKS.md.tmpl": filepath.Join(d.root, "BENCHMARKS.md"), "details.md.tmpl": filepath.Join(d.results, "details.md")} {
		t, err := template.New(file).Option("missingkey=zero").Funcs(funcs).ParseFS(templates, file)
		if err != nil {
			return err
		}
		var b strings.Builder
		if err := t.Execute(&b, data); err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// readMachine returns the lines of results/machine.txt, by name.
func readMachine(d dirs) map[string]string {
	m := map[string]string{}
	b, err := os.ReadFile(filepath.Join(d.results, "machine.txt"))
	if err != nil {
		return m
	}
	for _, kv := range parseMachine(string(b)) {
		m[kv[0]] = kv[1]
	}
	return m
}

// reruns describes the steps of machine (readMachine's) run alone since
// the full run (see noteSteps), in the steps' order: "" when none was.
func reruns(machine map[string]string) string {
	var parts []string
	for _, name := range stepNames() {
		if v, ok := machine[stepPrefix+name]; ok {
			parts = append(parts, "`"+name+"` "+v)
		}
	}
	return strings.Join(parts, "; ")
}

// ratio formats a ratio of times.
func ratio(x float64) string { return fmt.Sprintf("%.2f×", x) }

// micros formats a time given in seconds in microseconds.
func micros(seconds float64) string { return fmt.Sprintf("%.1f µs", seconds*1e6) }

// number formats x of unit: a time in µs to a tenth, a ratio to a hundredth.
func number(unit string, x float64) string {
	if strings.Contains(unit, "µs") {
		return fmt.Sprintf("%.1f", x)
	}
	return fmt.Sprintf("%.2f", x)
}

// verdict is a judged row's last cell.
func verdict(ok bool) string {
	if ok {
		return "**met**"
	}
	return "**not met**"
}

// values returns the cells the templates place, by name.
func values(d dirs) map[string]string {
	v := map[string]string{}
	http := d.medians("http.txt", "-row", "/store,/work,/clients", "-col", "/side", "-ignore", "/round")
	get := func(m map[cell]float64, unit, row, col string) (float64, bool) {
		x, ok := m[cell{unit, row, col}]
		return x, ok && x > 0
	}
	// of is the time per request of side a over side b's in row.
	of := func(m map[cell]float64, row, a, b string) (float64, float64, float64, bool) {
		x, ok1 := get(m, "sec/op", row, a)
		y, ok2 := get(m, "sec/op", row, b)
		return x / y, x, y, ok1 && ok2
	}
	for _, sw := range []string{"memstore replay", "memstore first", "redis replay", "redis first", "postgres replay", "postgres first", "postgres tx", "sqlite replay", "sqlite first", "sqlite tx"} {
		name := strings.ReplaceAll(sw, " ", "_")
		if r, mw, fl, ok := of(http, sw+" 1", "mw", "floor"); ok {
			v["floor_"+name] = fmt.Sprintf("%s (record floor %s, middleware %s per request) | %s", ratio(r), micros(fl), micros(mw), verdict(r <= floorLimit))
		} else {
			v["floor_"+name] = notMeasured
		}
		if r, _, _, ok := of(http, sw+" 64", "mw", "floor"); ok {
			v["floor64_"+name] = ratio(r)
		}
		// The reported ratios: <key>_<store>_<work>_<clients> is side a
		// over side b.
		for _, p := range [][3]string{{"bare", "mw", "bare"}, {"cached", "cached", "mw"}, {"timeout", "timeout", "floor"}, {"floorbare", "floor", "bare"}, {"mwfloor", "mw", "floor"}, {"default", "mw", "timeout"}} {
			for _, c := range []string{"1", "16", "64"} {
				if r, _, _, ok := of(http, sw+" "+c, p[1], p[2]); ok {
					v[p[0]+"_"+name+"_"+c] = ratio(r)
				}
			}
		}
	}
	v["sqlite_beside"] = sqliteBeside(http)
	// A go-redis client at its defaults against one with
	// ContextTimeoutEnabled, at one client and at 64.
	var def []string
	met := true
	for _, c := range []string{"1", "64"} {
		var parts []string
		for _, w := range []string{"replay", "first"} {
			r, mw, to, ok := of(http, "redis "+w+" "+c, "mw", "timeout")
			if !ok {
				met = false
				parts = append(parts, w+" not measured")
				continue
			}
			met = met && r <= defaultLimit
			parts = append(parts, fmt.Sprintf("%s %s (%s against %s)", strings.ReplaceAll(w, "first", "first execution"), ratio(r), micros(mw), micros(to)))
		}
		def = append(def, fmt.Sprintf("%s client%s: %s", c, map[bool]string{true: "s"}[c != "1"], strings.Join(parts, ", ")))
	}
	v["redis_default"] = strings.Join(def, "; ") + " | " + verdict(met)
	peers := d.medians("peers.txt", "-row", "/stack,/work,/clients", "-col", "/side", "-ignore", "/round")
	for _, row := range []string{"idempotency first", "idempotency replay", "fiber first", "fiber replay"} {
		for _, c := range []string{"1", "64"} {
			if r, _, _, ok := of(peers, row+" "+c, "mw", "bare"); ok {
				v["peer_"+strings.ReplaceAll(row, " ", "_")+"_"+c] = ratio(r)
			}
		}
	}
	fn := d.medians("functions.txt", "-col", ".name")
	var calls []string
	for _, store := range []string{"memstore", "redis", "postgres"} {
		var parts []string
		for _, work := range []string{"FirstExecution", "Replay"} {
			do, ok1 := get(fn, "sec/op", store+"/"+work, "Do")
			fl, ok2 := get(fn, "sec/op", store+"/"+work+"Floor", "Do")
			if ok1 && ok2 {
				parts = append(parts, fmt.Sprintf("%s %s (%s against %s)", strings.ToLower(work[:1])+strings.ReplaceAll(work[1:], "Execution", " execution"), ratio(do/fl), micros(do), micros(fl)))
			}
		}
		if parts != nil {
			calls = append(calls, store+": "+strings.Join(parts, ", "))
		}
	}
	v["functions"] = strings.Join(calls, "; ")
	v["roundtrips"] = roundTrips(d)
	// A memstore request's store calls rise by a few hundred nanoseconds
	// with the cache misses of a larger map: judged against a whole
	// request over loopback, the bare handler's with one client.
	request, _ := get(http, "sec/op", "memstore replay 1", "bare")
	mem := d.medians("memstore-keycount.txt", "-col", "/keys")
	v["keys_memstore"] = flat(func(c, n string) (float64, bool) { return get(mem, "sec/op", "KeyCount/"+c, n) }, request)
	for _, store := range []string{"redis", "postgres", "sqlite"} {
		kc := d.medians(store + "-keycount.txt")
		col := store + "-keycount.txt"
		v["keys_"+store] = flat(func(c, n string) (float64, bool) { return get(kc, "sec/req@keys="+n, "KeyCount/"+c, col) }, 0)
		// SQLite's replays are read beside its record floor on the same
		// files: whether a rise is the store's or the file's.
		floorAt := func(n string) (float64, bool) { return get(kc, "sec/floor@keys="+n, "KeyCount/Replay", col) }
		if base, rise, ok := largestRise(floorAt); ok && store == "sqlite" {
			judged, judgement, _ := strings.Cut(v["keys_"+store], " | ")
			v["keys_"+store] = fmt.Sprintf("%s; the record floor's replay on the same files (one `SELECT` by primary key) %+.0f%% (%s at 10³) | %s",
				judged, 100*rise/base, micros(base), judgement)
		}
	}
	mw := d.medians("middleware.txt", "-col", ".name")
	var allocs []string
	for _, size := range []string{"0", "1024", "65536"} {
		bare, ok1 := get(mw, "allocs/op", "Bare/body="+size, "Middleware")
		first, ok2 := get(mw, "allocs/op", "FirstExecution/body="+size, "Middleware")
		replay, ok3 := get(mw, "allocs/op", "Replay/body="+size, "Middleware")
		if ok1 && ok2 && ok3 {
			allocs = append(allocs, fmt.Sprintf("%s B: first execution +%.0f, replay +%.0f", size, first-bare, replay-bare))
		}
	}
	v["allocs"] = strings.Join(allocs, "; ")
	memory := d.medians("memstore-memory.txt", "-col", ".name")
	var bytes []string
	for _, size := range []string{"0", "1024", "16384"} {
		if x, ok := get(memory, "overhead-bytes/record", "body="+size, "RecordMemory"); ok {
			bytes = append(bytes, fmt.Sprintf("%.0f B at a %s B body", x, size))
		}
	}
	v["memory"] = strings.Join(bytes, ", ")
	st := d.medians("redis-server-time.txt", "-col", ".name")
	for _, unit := range []string{"acquire-new-µs", "complete-µs", "floor-create-µs", "floor-store-µs", "replay-µs", "floor-read-µs", "replay-expiry-µs", "first/floor", "replay/floor"} {
		if x, ok := get(st, unit, "", "ServerTime"); ok {
			v["st_"+strings.NewReplacer("-µs", "", "-", "_", "/", "_").Replace(unit)] = number(unit, x)
		}
	}
	cl := d.medians("redis-cluster.txt", "-col", ".name")
	for _, unit := range []string{"cpu-µs/fe@watched", "cpu-µs/fe@always", "watched/always"} {
		if x, ok := get(cl, unit, "", "ClusterPublish"); ok {
			v["cluster_"+strings.NewReplacer("cpu-µs/fe@", "", "/", "_").Replace(unit)] = number(unit, x)
		}
	}
	outboxValues(d, v)
	stateValues(d, v)
	return v
}

// sqliteBeside describes the time per request of the middleware on
// SQLite beside the same on memstore and on PostgreSQL, measured in the
// same rounds as sides of BenchmarkHTTP's store=sqlite groups (medians
// http, rows store, work and clients, columns the side): "" when SQLite
// was not measured.
func sqliteBeside(http map[cell]float64) string {
	var parts []string
	for _, c := range []string{"1", "64"} {
		var works []string
		for _, w := range []struct{ name, label string }{{"replay", "replay"}, {"first", "first execution"}, {"tx", "transactional route"}} {
			row := "sqlite " + w.name + " " + c
			mw, ok := http[cell{"sec/op", row, "mw"}]
			if !ok {
				continue
			}
			stores := []string{"SQLite " + micros(mw)}
			for _, o := range []struct{ side, name string }{{"memstore", "memstore"}, {"postgres", "PostgreSQL"}} {
				if w.name == "tx" && o.side == "memstore" {
					continue // memstore has no transactions
				}
				if x, ok := http[cell{"sec/op", row, o.side}]; ok {
					stores = append(stores, fmt.Sprintf("%s %s (%s)", o.name, micros(x), ratio(mw/x)))
				} else {
					stores = append(stores, o.name+" not measured")
				}
			}
			works = append(works, w.label+": "+strings.Join(stores, ", "))
		}
		if works != nil {
			parts = append(parts, fmt.Sprintf("%s client%s, %s", c, map[bool]string{true: "s"}[c != "1"], strings.Join(works, "; ")))
		}
	}
	return strings.Join(parts, ". ")
}

// stateLimit: a state record's transition with its event within this of
// its hand-written floor's time (package statebench).
const stateLimit = 1.15

// The outbox relay's targets: at its defaults it drains a backlog at
// least at outboxLimitShare of JetStream's own asynchronous publication
// measured in the same run, in at most outboxFloorLimit times its floor's
// time per message; one message's commit-to-stream p99 is under
// outboxP99 milliseconds.
const (
	outboxLimitShare = 0.25
	outboxFloorLimit = 1.2
	outboxP99        = 50.0
)

// river is River's throughput with a worker publishing each job's message,
// by workers, from the earlier side-by-side: River is not in this
// repository, so its figures are quoted, not measured.
var river = []struct {
	workers int
	rate    float64
}{{1, 580}, {4, 1941}, {100, 14715}}

// brokerNames are the outbox benchmark's brokers, as the cells name them.
var brokerNames = map[string]string{"jetstream": "JetStream", "rabbitmq": "RabbitMQ"}

// outboxValues adds the outbox's cells to v: the relay's throughput
// beside the broker's limit, its floor and a plain publishing loop, what a
// message costs the database and the CPUs, commit-to-stream latency, and
// the cost of an enqueued message on a transactional route.
func outboxValues(d dirs, v map[string]string) {
	outboxThroughput(d.medians("outbox-throughput.txt", "-row", "/broker,/concurrency", "-col", "/side"), cpuCores(d), v)
	lat := d.medians("outbox-latency.txt", "-col", ".name")
	p50, ok1 := lat[cell{"p50-ms", "", "CommitToStream"}]
	p99, ok2 := lat[cell{"p99-ms", "", "CommitToStream"}]
	if ok1 && ok2 {
		v["outbox_latency"] = fmt.Sprintf("p50 %.1f ms, p99 %.1f ms | %s", p50, p99, verdict(p99 < outboxP99))
	} else {
		v["outbox_latency"] = notMeasured
	}
	route := d.medians("outbox-route.txt", "-row", ".name", "-col", "/side", "-ignore", "/round")
	with, ok1 := route[cell{"sec/op", "EnqueueCost", "outbox"}]
	without, ok2 := route[cell{"sec/op", "EnqueueCost", "tx"}]
	if ok1 && ok2 && without > 0 {
		v["outbox_route"] = fmt.Sprintf("%s (%s per request with the message, %s without)", ratio(with/without), micros(with), micros(without))
	}
}

// stateValues adds the cells of the state records' benchmarks to v: a
// transition with its event against its hand-written floor, and what a
// transition adds to a transactional route.
func stateValues(d dirs, v map[string]string) {
	tr := d.medians("state-transition.txt", "-col", ".name")
	x, ok1 := tr[cell{"x-floor(p50)", "", "Transition"}]
	st, ok2 := tr[cell{"µs/transition(p50,state)", "", "Transition"}]
	fl, ok3 := tr[cell{"µs/transition(p50,floor)", "", "Transition"}]
	if ok1 && ok2 && ok3 {
		v["state_transition"] = fmt.Sprintf("%s (the Store's transition %.0f µs, the floor's %.0f µs, medians) | %s", ratio(x), st, fl, verdict(x <= stateLimit))
	} else {
		v["state_transition"] = notMeasured
	}
	rt := d.medians("state-route.txt", "-col", ".name")
	with, ok1 := rt[cell{"µs/request(p50,tx+transition)", "", "RouteTransition"}]
	without, ok2 := rt[cell{"µs/request(p50,tx)", "", "RouteTransition"}]
	if ok1 && ok2 && without > 0 {
		v["state_route"] = fmt.Sprintf("%s (%.0f µs per request with the transition, %.0f µs without, medians)", ratio(with/without), with, without)
	}
}

// outboxThroughput adds the cells of the throughput benchmark to v, from
// its medians thr (rows broker and concurrency, columns the side), on a
// machine of cores (0: unknown).
func outboxThroughput(thr map[cell]float64, cores int, v map[string]string) {
	// at returns the median of unit for side, in the row of broker at
	// concurrency c ("" for the rows without one: limit, batch, floor).
	at := func(unit, broker, c, side string) (float64, bool) {
		x, ok := thr[cell{unit, strings.TrimSpace(broker + " " + c), side}]
		return x, ok && x > 0
	}
	rate := func(broker, c, side string) (float64, bool) { return at("msgs/s", broker, c, side) }

	var limitParts, floorParts, thrParts, costParts, cpuParts, riverParts []string
	limitMet, floorMet := false, true
	for _, broker := range []string{"jetstream", "rabbitmq"} {
		name := brokerNames[broker]
		limit, okL := rate(broker, "", "limit")
		floor, okF := rate(broker, "", "floor")
		relay, okR := rate(broker, "1", "relay")
		if okL && okR {
			share := relay / limit
			if broker == "jetstream" {
				limitMet = share >= outboxLimitShare
			}
			limitParts = append(limitParts, fmt.Sprintf("%s: relay %.0f msgs/s, the broker's limit %.0f msgs/s: %.2f×", name, relay, limit, share))
		} else {
			limitParts = append(limitParts, name+" not measured")
		}
		if okF && okR {
			slower := floor / relay // the relay's time per message over the floor's
			floorMet = floorMet && slower <= outboxFloorLimit
			floorParts = append(floorParts, fmt.Sprintf("%s: relay %.0f msgs/s, floor %.0f msgs/s: %s the floor's time per message", name, relay, floor, ratio(slower)))
		} else {
			floorMet = false
			floorParts = append(floorParts, name+" not measured")
		}

		var rows []string
		for _, side := range []struct{ label, c, side string }{
			{"limit", "", "limit"}, {"PublishBatch", "", "batch"}, {"floor", "", "floor"},
			{"relay", "1", "relay"}, {"relay at concurrency 4", "4", "relay"}, {"relay through Publish alone, concurrency 4", "4", "relay-each"},
			{"plain loop", "1", "plain"}, {"plain loop at concurrency 4", "4", "plain"},
		} {
			if x, ok := rate(broker, side.c, side.side); ok {
				text := fmt.Sprintf("%s %.0f", side.label, x)
				if okL && side.side != "limit" {
					text += fmt.Sprintf(" (%.2f×)", x/limit)
				}
				rows = append(rows, text)
			}
		}
		if rows != nil {
			thrParts = append(thrParts, fmt.Sprintf("%s, msgs/s (over the limit): %s", name, strings.Join(rows, ", ")))
		}

		var costs []string
		for _, side := range []struct{ label, c, side string }{{"relay", "1", "relay"}, {"floor", "", "floor"}} {
			commits, ok1 := at("commits/msg", broker, side.c, side.side)
			wal, ok2 := at("WAL-B/msg", broker, side.c, side.side)
			if !ok1 || !ok2 {
				continue
			}
			c := fmt.Sprintf("%s %.4f commits and %.0f B of WAL per message", side.label, commits, wal)
			if own, ok := at("own-WAL-B/msg", broker, side.c, side.side); ok {
				c += fmt.Sprintf(" (%.0f B of it the database's)", own)
			}
			if hot, ok := thr[cell{"HOT-%", strings.TrimSpace(broker + " " + side.c), side.side}]; ok {
				c += fmt.Sprintf(", %.0f%% of the row updates HOT", hot)
			}
			costs = append(costs, c)
		}
		if costs != nil {
			costParts = append(costParts, name+": "+strings.Join(costs, "; "))
		}

		var cpus []string
		for _, side := range []struct{ label, c, side string }{{"relay", "1", "relay"}, {"floor", "", "floor"}, {"limit", "", "limit"}} {
			proc, ok := at("proc-cpu-µs/msg", broker, side.c, side.side)
			if !ok {
				continue
			}
			total := proc
			c := fmt.Sprintf("%s %.1f µs in its process", side.label, proc)
			if pg, ok := at("pg-cpu-µs/msg", broker, side.c, side.side); ok {
				c += fmt.Sprintf(", %.1f in PostgreSQL", pg)
				total += pg
			}
			if b, ok := at("broker-cpu-µs/msg", broker, side.c, side.side); ok {
				c += fmt.Sprintf(", %.1f in the broker", b)
				total += b
			}
			if cores > 0 {
				c += fmt.Sprintf(": %.1f µs, at most %.0f msgs/s on %d cores", total, float64(cores)*1e6/total, cores)
			}
			cpus = append(cpus, c)
		}
		if cpus != nil {
			cpuParts = append(cpuParts, name+": "+strings.Join(cpus, "; "))
		}

		var ahead []string
		r1, ok1 := rate(broker, "1", "relay")
		r4, ok4 := rate(broker, "4", "relay")
		if ok1 && ok4 {
			for _, rv := range river {
				ours := r1
				if rv.workers >= 4 {
					ours = max(r1, r4)
				}
				ahead = append(ahead, fmt.Sprintf("%d %s %.0f against %.0f (%.1f×)", rv.workers, map[bool]string{true: "workers", false: "worker"}[rv.workers > 1], ours, rv.rate, ours/rv.rate))
			}
			riverParts = append(riverParts, name+": "+strings.Join(ahead, ", "))
		}
	}
	v["outbox_limit"] = strings.Join(limitParts, "; ") + " | " + verdict(limitMet)
	v["outbox_floor"] = strings.Join(floorParts, "; ") + " | " + verdict(floorMet)
	v["outbox_throughput"] = strings.Join(thrParts, ". ")
	v["outbox_cost"] = strings.Join(costParts, ". ")
	v["outbox_cpu"] = strings.Join(cpuParts, ". ")
	v["outbox_river"] = strings.Join(riverParts, ". ")
}

// cpuCores returns the machine's cores as results/machine.txt gives them,
// 0 when it does not.
func cpuCores(d dirs) int {
	n, _ := strconv.Atoi(readMachine(d)["Cores"])
	return n
}

// flat judges whether the cost per request of a replay and of a first
// execution stays flat from 10³ to 10⁶ live records: at(case, n) is the
// median time at n records; the largest rise over the 10³ value is judged
// against request when it is set (and is then given in ns), else against
// the 10³ value itself.
func flat(at func(c, n string) (float64, bool), request float64) string {
	var parts []string
	ok := true
	for _, c := range []string{"Replay", "FirstExecution"} {
		base, rise, found := largestRise(func(n string) (float64, bool) { return at(c, n) })
		if !found {
			return notMeasured
		}
		if request > 0 {
			ok = ok && rise <= flatLimit*request
			parts = append(parts, fmt.Sprintf("%s +%.0f ns (%.1f%% of a %s loopback request)", c, rise*1e9, 100*rise/request, micros(request)))
		} else {
			ok = ok && rise <= flatLimit*base
			parts = append(parts, fmt.Sprintf("%s %+.0f%% (%s at 10³)", c, 100*rise/base, micros(base)))
		}
	}
	return "largest rise over the 10³ value: " + strings.Join(parts, "; ") + " | " + verdict(ok)
}

// largestRise returns the value at 10³ records that at(n) gives, and the
// largest rise over it at 10⁴, 10⁵ and 10⁶; false when one is missing.
func largestRise(at func(n string) (float64, bool)) (base, rise float64, ok bool) {
	if base, ok = at("1000"); !ok {
		return 0, 0, false
	}
	for _, n := range []string{"10000", "100000", "1000000"} {
		x, ok := at(n)
		if !ok {
			return 0, 0, false
		}
		rise = math.Max(rise, x-base)
	}
	return base, rise, true
}

// roundTrips judges the round-trip tests from their verbose output: each
// must have passed, none failed or skipped.
func roundTrips(d dirs) string {
	b, err := os.ReadFile(filepath.Join(d.results, "roundtrips.txt"))
	if err != nil {
		return notMeasured
	}
	var passed, failed []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "---" || strings.Contains(f[2], "/") {
			continue
		}
		if f[1] == "PASS:" {
			passed = append(passed, "`"+f[2]+"`")
		} else {
			failed = append(failed, "`"+f[2]+"` "+strings.ToLower(strings.TrimSuffix(f[1], ":")))
		}
	}
	measured := fmt.Sprintf("%d tests passed (%s)", len(passed), strings.Join(passed, ", "))
	if len(failed) > 0 {
		measured += "; " + strings.Join(failed, ", ")
	}
	want := len(roundTripTests) + 1 // TestRoundTrips is redisstore's and pgstore's
	return measured + " | " + verdict(len(failed) == 0 && len(passed) == want)
}
