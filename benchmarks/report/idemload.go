package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// idemloadPkg is the load command, in the benchmarks module.
const idemloadPkg = "./idemload"

var idemloadPage = page{
	file:  "idemload.md",
	title: "idemload",
	about: "the middleware on memstore and on Redis over loopback HTTP beside the bare handler and the floor, with a mix of first executions and duplicates",
	body:  idemloadBody,
}

// loadRun is one idemload invocation and its summary output.
type loadRun struct {
	args   []string
	output string
}

// idemloadRuns are the arguments of the idemload runs of a report.
func idemloadRuns(c config) [][]string {
	common := []string{"-duration", c.duration.String(), "-rounds", fmt.Sprint(c.rounds), "-body", "1024"}
	var runs [][]string
	for _, mix := range []string{"new=70,dup=20,concdup=10", "new=100", "dup=100"} {
		runs = append(runs, append([]string{"-concurrency", "16", "-mix", mix}, common...))
	}
	if !c.redis {
		return runs
	}
	redis := "auto"
	if addr := os.Getenv("REDIS_ADDR"); addr != "" {
		redis = addr
	}
	for _, conc := range []string{"1", "64"} {
		for _, mix := range []string{"new=100", "dup=100"} {
			runs = append(runs, append([]string{"-redis", redis, "-concurrency", conc, "-mix", mix}, common...))
		}
	}
	return append(runs, append([]string{"-redis", redis, "-concurrency", "16", "-mix", "new=70,dup=20,concdup=10"}, common...))
}

func runIdemload(c config, root string) ([]loadRun, error) {
	bin := filepath.Join(os.TempDir(), fmt.Sprintf("idemload-%d", os.Getpid()))
	build := exec.Command("go", "build", "-o", bin, idemloadPkg)
	build.Dir, build.Stderr = filepath.Join(root, toolsDir), os.Stderr
	if err := build.Run(); err != nil {
		return nil, fmt.Errorf("building idemload: %w", err)
	}
	defer os.Remove(bin)
	var out []loadRun
	for _, args := range idemloadRuns(c) {
		fmt.Fprintf(os.Stderr, "report: idemload %s\n", strings.Join(args, " "))
		cmd := exec.Command(bin, args...)
		var buf bytes.Buffer
		cmd.Stdout, cmd.Stderr = &buf, os.Stderr
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("idemload %s: %w", strings.Join(args, " "), err)
		}
		var lines []string
		for _, l := range strings.Split(strings.TrimRight(buf.String(), "\n"), "\n") {
			if !strings.HasPrefix(l, "  [") { // progress lines
				lines = append(lines, l)
			}
		}
		out = append(out, loadRun{args: args, output: strings.Join(lines, "\n")})
	}
	return out, nil
}

// idemloadRatio is the middleware's throughput ratio to target ("bare" or
// "floor") in the idemload run on Redis or on memstore with mix and
// clients.
func (ms *measured) idemloadRatio(redis bool, mix string, clients int, target string) (float64, bool) {
	for _, l := range ms.loads {
		if slices.Contains(l.args, "-redis") == redis && argAfter(l.args, "-mix") == mix && argAfter(l.args, "-concurrency") == strconv.Itoa(clients) {
			return ratioFromOutput(l.output, target)
		}
	}
	return 0, false
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

// latencyFromOutput reads "1.21x/1.30x flushfloor" from the middleware
// latency line of idemload output: the middleware's p50 and p99 latency
// over target's.
func latencyFromOutput(out, target string) (p50, p99 float64, ok bool) {
	for _, line := range strings.Split(out, "\n") {
		rest, found := strings.CutPrefix(line, "middleware latency ratio p50/p99:")
		if !found {
			continue
		}
		for _, part := range strings.Split(rest, ",") {
			f := strings.Fields(part)
			if len(f) != 2 || f[1] != target {
				continue
			}
			if _, err := fmt.Sscanf(f[0], "%gx/%gx", &p50, &p99); err == nil {
				return p50, p99, true
			}
		}
	}
	return 0, 0, false
}

// clientHearsTarget reports what a first execution's client waits for on
// Redis with one client over HTTP: the middleware flushes the response
// before it stores it, so it should wait for the handler plus one round
// trip (the flushed floor), not two (the floor).
func (ms *measured) clientHearsTarget() []string {
	target := "Redis, 1 client, 1 KiB, over HTTP: a first execution's client waits for the handler plus one round trip (p50/p99 latency beside the flushed floor)"
	for _, l := range ms.loads {
		if !slices.Contains(l.args, "-redis") || argAfter(l.args, "-mix") != "new=100" || argAfter(l.args, "-concurrency") != "1" {
			continue
		}
		f50, f99, ok1 := latencyFromOutput(l.output, "flushfloor")
		t50, t99, ok2 := latencyFromOutput(l.output, "floor")
		if !ok1 || !ok2 {
			break
		}
		return []string{target, fmt.Sprintf("p50 %.2f×, p99 %.2f× the bare handler plus one floor round trip (response flushed before the second); %.2f× and %.2f× the floor that answers after its second", f50, f99, t50, t99), "measured"}
	}
	return []string{target, "not measured in this run", "–"}
}

func idemloadBody(ms *measured, d *doc) {
	if len(ms.loads) == 0 {
		d.para("Not measured in this run.")
		return
	}
	d.para("`%s` with the flags shown: an HTTP server on 127.0.0.1 with the middleware (memstore, or Redis with `-redis`), the bare handler and, for Redis, the floor (bare handler + the raw EVALSHA round trips the request needs at best) and the flushed floor (the same, with the response flushed before a first execution's second round trip, as the middleware flushes it before storing it) and the record floor (`recordfloor`: the bare handler with the record floor's scripts on a hash per key, creating the record and then storing its payload for a first execution, reading the payload back for a duplicate, checking nothing) measured in the same run with the same clients. Progress lines are left out.", shellCommand(true, "go", "run", idemloadPkg))
	for _, l := range ms.loads {
		d.block("", "$ idemload "+strings.Join(l.args, " ")+"\n"+l.output)
	}
}
