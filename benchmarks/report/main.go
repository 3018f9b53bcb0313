// Command report runs the tests and benchmarks that BENCHMARKS.md judges
// and reports, keeps their raw go test output in benchmarks/results/ (one
// file per command, for benchstat), and writes BENCHMARKS.md and
// benchmarks/results/details.md from the templates beside this file, with
// the numbers benchstat gives. Run it in the benchmarks module:
//
//	cd benchmarks
//	go run ./report            # every step: about 20 minutes of both cores
//	go run ./report -quick     # shorter runs, to check the pipeline
//	go run ./report -render    # measures nothing: rewrites the pages
//	go run ./report -steps http,sqlite-keycount
//	                           # only these steps, then the pages from
//	                           # every results file
//
// The library's tests and benchmarks run in the library's module (the
// repository root), the others in the benchmarks module. Parts that need
// Redis, PostgreSQL, NATS or RabbitMQ skip themselves without a server (see the packages'
// documentation), and their rows then say so.
package main

import (
	"bytes"
	"cmp"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

func main() {
	quick := flag.Bool("quick", false, "shorter runs, to check the pipeline")
	render := flag.Bool("render", false, "measure nothing: rewrite the pages from benchmarks/results")
	only := flag.String("steps", "", "run only these steps (names separated by commas: "+strings.Join(stepNames(), ",")+
		"), then rewrite the pages from every results file, the other steps' kept from their last run")
	flag.Parse()
	if err := run(*quick, *render, *only); err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
}

// A step is one go test command, whose output is kept as results/<name>.txt.
type step struct {
	name  string
	tools bool     // runs in the benchmarks module, else in the library's
	args  []string // after "go test"
}

// steps are the commands of a report; quick ones are shorter.
func steps(quick bool) []step {
	pick := func(full, short string) string {
		if quick {
			return short
		}
		return full
	}
	count := pick("6", "1")
	bench := func(name string, tools bool, pattern, benchtime, pkg string, extra ...string) step {
		args := []string{"-run", "^$", "-bench", pattern, "-benchtime", benchtime, "-count", count, pkg}
		return step{name, tools, append(args, extra...)}
	}
	rounds := []string{"-args", "-rounds", pick("30", "2")}
	return []step{
		{"roundtrips", false, []string{"-count", "1", "-v", "-run", "^(" + strings.Join(roundTripTests, "|") + ")$", ".", "./redisstore/", "./pgstore/"}},
		withoutCount(bench("http", true, "^BenchmarkHTTP$", pick("250x", "100x"), "./httpbench/", rounds...)),
		withoutCount(bench("peers", true, "^BenchmarkPeers$", pick("250x", "100x"), "./httpbench/", rounds...)),
		bench("memstore-keycount", false, "^BenchmarkKeyCount$", pick("1s", "0.2s"), "./memstore/"),
		bench("redis-keycount", false, "^BenchmarkKeyCount$", pick("3000x", "300x"), "./redisstore/"),
		bench("postgres-keycount", true, "^BenchmarkKeyCount$", pick("500x", "100x"), "./pgbench/"),
		bench("sqlite-keycount", true, "^BenchmarkKeyCount$", pick("500x", "100x"), "./sqlitebench/"),
		bench("middleware", false, "^BenchmarkMiddleware$", pick("0.3s", "0.1s"), ".", "-benchmem"),
		withoutCount(bench("memstore-memory", false, "^BenchmarkRecordMemory$", "2x", "./memstore/")),
		bench("redis-server-time", true, "^BenchmarkServerTime$", pick("3000x", "300x"), "./redisbench/"),
		bench("redis-cluster", true, "^BenchmarkClusterPublish$", pick("10x", "2x"), "./redisbench/"),
		bench("functions", true, "^BenchmarkDo$", pick("2000x", "200x"), "./funcbench/", "-benchmem"),
		// A backlog of several of the relay's batches (500 messages), so
		// that its pipeline is full most of the drain.
		bench("outbox-throughput", true, "^BenchmarkRelayThroughput$", pick("10000x", "2000x"), "./outboxbench/"),
		bench("outbox-latency", true, "^BenchmarkCommitToStream$", pick("500x", "100x"), "./outboxbench/"),
		withoutCount(bench("outbox-route", true, "^BenchmarkEnqueueCost$", pick("250x", "50x"), "./outboxbench/", rounds...)),
		bench("state-transition", true, "^BenchmarkTransition$", pick("2000x", "200x"), "./statebench/"),
		bench("state-route", true, "^BenchmarkRouteTransition$", pick("1000x", "100x"), "./statebench/"),
	}
}

// stepNames are the names of the steps, in their order.
func stepNames() []string {
	var names []string
	for _, s := range steps(false) {
		names = append(names, s.name)
	}
	return names
}

// selectSteps returns the steps of all named in only (names separated by
// commas), in their order in all; every step when only is empty.
func selectSteps(all []step, only string) ([]step, error) {
	if only == "" {
		return all, nil
	}
	want := map[string]bool{}
	for _, name := range strings.Split(only, ",") {
		if name = strings.TrimSpace(name); name != "" {
			want[name] = true
		}
	}
	var picked []step
	for _, s := range all {
		if want[s.name] {
			picked = append(picked, s)
			delete(want, s.name)
		}
	}
	if len(want) > 0 {
		var unknown []string
		for name := range want {
			unknown = append(unknown, name)
		}
		slices.Sort(unknown)
		return nil, fmt.Errorf("-steps: no step named %s (the steps: %s)", strings.Join(unknown, ", "), strings.Join(stepNames(), ","))
	}
	if len(picked) == 0 {
		return nil, fmt.Errorf("-steps %q names no step", only)
	}
	return picked, nil
}

// withoutCount drops -count from s: its rounds, or its one sample, are the
// samples.
func withoutCount(s step) step {
	for i, a := range s.args {
		if a == "-count" {
			s.args = append(s.args[:i:i], s.args[i+2:]...)
			break
		}
	}
	return s
}

// roundTripTests are the tests that assert the round trips per request.
var roundTripTests = []string{"TestResponseBeforeStore", "TestRoundTrips", "TestHTTPRoundTrips", "TestRoundTripsThroughMiddleware"}

// command is the shell command that runs s from the repository root.
func (s step) command() string {
	words := []string{"go", "test"}
	for _, a := range s.args {
		if strings.ContainsAny(a, "^$|()*") {
			a = "'" + a + "'"
		}
		words = append(words, a)
	}
	line := strings.Join(words, " ")
	if s.tools {
		line = "cd benchmarks && " + line
	}
	return line
}

// dirs are the repository root and the directories the report writes.
type dirs struct{ root, tools, results string }

func findDirs() (dirs, error) {
	wd, err := os.Getwd()
	if err != nil {
		return dirs{}, err
	}
	if _, err := os.Stat(filepath.Join(wd, "report", "main.go")); err != nil {
		return dirs{}, errors.New("run the report in the benchmarks module: cd benchmarks && go run ./report")
	}
	root := filepath.Dir(wd)
	return dirs{root: root, tools: wd, results: filepath.Join(wd, "results")}, nil
}

func run(quick, render bool, only string) error {
	if render && only != "" {
		return errors.New("-render measures nothing: it takes no -steps")
	}
	d, err := findDirs()
	if err != nil {
		return err
	}
	ss, err := selectSteps(steps(quick), only)
	if err != nil {
		return err
	}
	if !render {
		if err := measure(d, ss, only != ""); err != nil {
			return err
		}
	}
	return writePages(d)
}

// measure runs the steps ss, keeping their output, and notes the machine
// in results/machine.txt: for every step (a full run), the run's start and
// end; for some (partial), a line per step, beside the last full run's
// notes (see noteSteps).
func measure(d dirs, ss []step, partial bool) error {
	if err := os.MkdirAll(d.results, 0o755); err != nil {
		return err
	}
	first := [2]string{now(), loadAverage()}
	var failed []string
	var notes [][2]string
	for _, s := range ss {
		fmt.Fprintln(os.Stderr, "report:", s.command())
		began := [2]string{now(), loadAverage()}
		start := time.Now()
		cmd := exec.Command("go", append([]string{"test", "-timeout", "60m"}, s.args...)...)
		cmd.Dir = d.root
		if s.tools {
			cmd.Dir = d.tools
		}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, os.Stderr
		err := cmd.Run()
		if werr := os.WriteFile(filepath.Join(d.results, s.name+".txt"), out.Bytes(), 0o644); werr != nil {
			return werr
		}
		// A failed test is a verdict; a failed benchmark leaves its rows
		// without numbers, and the others are still measured.
		if err != nil {
			failed = append(failed, s.name)
			if s.name != "roundtrips" {
				os.Stderr.Write(out.Bytes())
			}
		}
		fmt.Fprintf(os.Stderr, "report:   %v (%v)\n", time.Since(start).Round(time.Second), cmp.Or[any](err, "ok"))
		notes = append(notes, stepNote(s.name, began, [2]string{now(), loadAverage()}))
	}
	last := [2]string{now(), loadAverage()}
	m := [][2]string{{"Started", first[0]}, {"Load average at the start", first[1]}, {"Finished", last[0]}, {"Load average at the end", last[1]}}
	m = append(m, machine()...)
	if partial {
		old, err := os.ReadFile(filepath.Join(d.results, "machine.txt"))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		// Without a full run's notes, the machine's alone.
		base := parseMachine(string(old))
		if len(base) == 0 {
			base = machine()
		}
		m = noteSteps(base, notes)
	}
	var b strings.Builder
	for _, kv := range m {
		fmt.Fprintf(&b, "%s: %s\n", kv[0], kv[1])
	}
	if err := os.WriteFile(filepath.Join(d.results, "machine.txt"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	if len(failed) > 0 {
		fmt.Fprintf(os.Stderr, "report: failed: %s (their rows say so)\n", strings.Join(failed, ", "))
	}
	return nil
}

// stepPrefix starts the name of a line of machine.txt that notes a step
// run alone (see noteSteps).
const stepPrefix = "Step "

// stepNote is the line of machine.txt that notes step name run alone
// from start to end (each a time and a load average): "Step <name>:
// <start> to <end>, load average <at the start> to <at the end>".
func stepNote(name string, start, end [2]string) [2]string {
	return [2]string{stepPrefix + name, fmt.Sprintf("%s to %s, load average %s to %s", start[0], end[0], start[1], end[1])}
}

// noteSteps returns the lines of machine.txt old (a full run's, and steps
// run alone since) with notes (stepNote's) in place of the same steps'
// earlier ones.
func noteSteps(old, notes [][2]string) [][2]string {
	rerun := map[string]bool{}
	for _, n := range notes {
		rerun[n[0]] = true
	}
	var m [][2]string
	for _, kv := range old {
		if !rerun[kv[0]] {
			m = append(m, kv)
		}
	}
	return append(m, notes...)
}

// parseMachine reads the lines of machine.txt, "name: value" each.
func parseMachine(text string) [][2]string {
	var m [][2]string
	for _, line := range strings.Split(text, "\n") {
		if k, v, ok := strings.Cut(line, ": "); ok {
			m = append(m, [2]string{k, v})
		}
	}
	return m
}

func now() string { return time.Now().UTC().Format("2006-01-02 15:04 MST") }

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "–"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// machine describes where the numbers were measured.
func machine() [][2]string {
	output := func(name string, args ...string) string {
		out, err := exec.Command(name, args...).Output()
		if err != nil {
			return "–"
		}
		return strings.TrimSpace(string(out))
	}
	cpu := "–"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	pg := output("psql", "-h", "127.0.0.1", "-U", "postgres", "-Atc",
		"SELECT version() || ' (fsync ' || current_setting('fsync') || ', synchronous_commit ' || current_setting('synchronous_commit') || ')'")
	return [][2]string{
		{"CPU", cpu},
		{"Cores", fmt.Sprint(runtime.NumCPU())},
		{"OS", output("uname", "-sr")},
		{"Go", output("go", "version")},
		{"Redis", output("redis-server", "--version")},
		{"PostgreSQL", pg},
	}
}
