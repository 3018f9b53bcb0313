package main

import (
	"bufio"
	"embed"
	"fmt"
	"math"
	"os"
	"path/filepath"
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
	data := map[string]any{"machine": readMachine(d), "v": values(d)}
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
	f, err := os.Open(filepath.Join(d.results, "machine.txt"))
	if err != nil {
		return m
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ": "); ok {
			m[k] = v
		}
	}
	return m
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
	for _, sw := range []string{"memstore replay", "memstore first", "redis replay", "redis first", "postgres replay", "postgres first", "postgres tx"} {
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
	for _, store := range []string{"redis", "postgres"} {
		kc := d.medians(store + "-keycount.txt")
		col := store + "-keycount.txt"
		v["keys_"+store] = flat(func(c, n string) (float64, bool) { return get(kc, "sec/req@keys="+n, "KeyCount/"+c, col) }, 0)
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
	return v
}

// outboxValues adds the outbox's cells to v: the relay's throughput beside
// the plain publishing loop's, commit-to-stream latency, and the cost of
// an enqueued message on a transactional route.
func outboxValues(d dirs, v map[string]string) {
	thr := d.medians("outbox-throughput.txt", "-row", "/broker,/concurrency", "-col", "/side")
	var parts []string
	for _, broker := range []string{"jetstream", "rabbitmq"} {
		for _, c := range []string{"1", "4"} {
			relay, ok1 := thr[cell{"msgs/s", broker + " " + c, "relay"}]
			plain, ok2 := thr[cell{"msgs/s", broker + " " + c, "plain"}]
			if ok1 && ok2 && plain > 0 {
				parts = append(parts, fmt.Sprintf("%s, concurrency %s: relay %.0f msgs/s, plain loop %.0f msgs/s (%.2f×)", map[string]string{"jetstream": "JetStream", "rabbitmq": "RabbitMQ"}[broker], c, relay, plain, relay/plain))
			}
		}
	}
	v["outbox_throughput"] = strings.Join(parts, "; ")
	lat := d.medians("outbox-latency.txt", "-col", ".name")
	p50, ok1 := lat[cell{"p50-ms", "", "CommitToStream"}]
	p99, ok2 := lat[cell{"p99-ms", "", "CommitToStream"}]
	if ok1 && ok2 {
		v["outbox_latency"] = fmt.Sprintf("p50 %.1f ms, p99 %.1f ms", p50, p99)
	}
	route := d.medians("outbox-route.txt", "-row", ".name", "-col", "/side", "-ignore", "/round")
	with, ok1 := route[cell{"sec/op", "EnqueueCost", "outbox"}]
	without, ok2 := route[cell{"sec/op", "EnqueueCost", "tx"}]
	if ok1 && ok2 && without > 0 {
		v["outbox_route"] = fmt.Sprintf("%s (%s per request with the message, %s without)", ratio(with/without), micros(with), micros(without))
	}
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
		base, found := at(c, "1000")
		if !found {
			return notMeasured
		}
		rise := 0.0
		for _, n := range []string{"10000", "100000", "1000000"} {
			x, found := at(c, n)
			if !found {
				return notMeasured
			}
			rise = math.Max(rise, x-base)
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
