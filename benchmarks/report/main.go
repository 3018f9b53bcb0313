// Command report runs the project's benchmarks and the idemload command,
// and rewrites BENCHMARKS.md and benchmarks/keycount.svg from what they
// measured. Run it from anywhere in the module:
//
//	go run ./benchmarks/report            # about 20 minutes
//	go run ./benchmarks/report -quick     # one sample per row, shorter runs
//	go run ./benchmarks/report -render    # no measuring: rewrite from the last run's results
//
// The Redis parts need redis-server on PATH (a private server is started
// on a loopback port and stopped) or REDIS_ADDR; without either they are
// left out. The raw go test output is kept in benchmarks/results/ for
// benchstat.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

type config struct {
	root     string
	count    int
	rounds   int
	duration time.Duration
	quick    bool
	redis    bool
	render   bool
}

func main() {
	var c config
	flag.IntVar(&c.count, "count", 5, "samples per benchmark row (go test -count)")
	flag.IntVar(&c.rounds, "rounds", 3, "idemload rounds per run")
	flag.DurationVar(&c.duration, "duration", 2*time.Second, "idemload and benchmarks/peers: measured time per target and round")
	flag.BoolVar(&c.quick, "quick", false, "one sample per row and shorter runs, to check the pipeline")
	flag.BoolVar(&c.render, "render", false, "measure nothing: rewrite BENCHMARKS.md and the plot from benchmarks/results")
	flag.Parse()
	if c.quick {
		c.count, c.rounds, c.duration = 1, 1, time.Second
	}
	if c.count < 1 || c.count > 20 || c.rounds < 1 || c.rounds > 20 || c.duration <= 0 || c.duration > time.Minute {
		fmt.Fprintln(os.Stderr, "report: -count and -rounds must be 1..20, -duration 0..1m")
		os.Exit(2)
	}
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("not inside the module")
	}
	return filepath.Dir(gomod), nil
}

// step is one go test invocation whose output is kept as results/<name>.txt.
type step struct {
	name string
	args []string
}

// steps are the go test runs of a report, in order.
func steps(c config) []step {
	count := fmt.Sprint(c.count)
	redisTime, pairedN := "0.5s", "3000x"
	keyCountN := "3000x" // ops of 4 requests, one per size
	phasedN := "20x"     // ops of 4 phases of 64×25 requests
	clusterN := "10x"    // ops of 2 phases of 32×25 first executions
	if c.quick {
		redisTime, pairedN, keyCountN, phasedN, clusterN = "2000x", "500x", "1000x", "2x", "2x"
	}
	steps := []step{
		{"middleware", []string{"-bench", "^BenchmarkMiddleware$", "-count", count, "."}},
		{"middleware-parallel", []string{"-bench", "^BenchmarkMiddlewareParallel$", "-cpu", "1,2", "-count", count, "."}},
		{"memstore", []string{"-bench", "^Benchmark(AcquireComplete|AcquireReplay|ShardLocks)$", "-cpu", "1,2", "-count", count, "./memstore/"}},
		{"memstore-memory", []string{"-bench", "^BenchmarkRecordMemory$", "-benchtime", "2x", "-count", "1", "./memstore/"}},
		{"memstore-keycount", []string{"-bench", "^BenchmarkKeyCount$", "-count", count, "./memstore/"}},
		{"loopback", []string{"-bench", "^BenchmarkLoopback", "-count", count, "./benchmarks/load/"}},
	}
	if c.redis {
		steps = append(steps,
			step{"redis", []string{"-bench", "^BenchmarkMiddlewareRedis$", "-benchtime", redisTime, "-count", count, "./redisstore/"}},
			step{"redis-paired", []string{"-bench", "^BenchmarkMiddlewareRedisPaired$", "-benchtime", pairedN, "-count", count, "./redisstore/"}},
			step{"redis-phased", []string{"-bench", "^BenchmarkMiddlewareRedisPhased$", "-benchtime", phasedN, "-count", count, "./redisstore/"}},
			step{"redis-keycount", []string{"-bench", "^BenchmarkKeyCount$", "-benchtime", keyCountN, "-count", count, "./redisstore/"}},
			step{"redis-cluster", []string{"-bench", "^BenchmarkClusterPublish$", "-benchtime", clusterN, "-count", count, "./redisstore/"}},
		)
	}
	return steps
}

func run(c config) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	c.root = root
	resDir := filepath.Join(root, "benchmarks", "results")
	if c.render {
		ms, err := loadMeasured(c, resDir)
		if err != nil {
			return err
		}
		if err := ms.write(root); err != nil {
			return err
		}
		fmt.Fprintln(os.Stderr, "report: rewrote BENCHMARKS.md and benchmarks/keycount.svg from", resDir)
		return nil
	}
	_, lookErr := exec.LookPath("redis-server")
	c.redis = lookErr == nil || os.Getenv("REDIS_ADDR") != ""
	if err := os.MkdirAll(resDir, 0o755); err != nil {
		return err
	}
	res := map[string]*results{}
	for _, s := range steps(c) {
		args := append([]string{"test", "-run", "^$", "-benchmem", "-timeout", "30m"}, s.args...)
		fmt.Fprintf(os.Stderr, "report: go %s\n", strings.Join(args, " "))
		start := time.Now()
		cmd := exec.Command("go", args...)
		cmd.Dir = root
		var out bytes.Buffer
		cmd.Stdout = &out
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			os.Stderr.Write(out.Bytes())
			return fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
		}
		fmt.Fprintf(os.Stderr, "report:   %v\n", time.Since(start).Round(time.Second))
		if err := os.WriteFile(filepath.Join(resDir, s.name+".txt"), out.Bytes(), 0o644); err != nil {
			return err
		}
		r := newResults()
		r.parse(bytes.NewReader(out.Bytes()))
		res[s.name] = r
	}

	loads, err := runIdemload(c)
	if err != nil {
		return err
	}
	peers, err := runPeers(c, resDir)
	if err != nil {
		return err
	}
	var scripts *scriptCosts
	if c.redis {
		if scripts, err = measureScripts(context.Background()); err != nil {
			return err
		}
	}
	ms := &measured{c: c, m: machine(c), res: res, loads: loads, scripts: scripts, peers: peers}
	if err := ms.save(resDir); err != nil {
		return err
	}
	if err := ms.write(root); err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "report: wrote BENCHMARKS.md and benchmarks/keycount.svg")
	return nil
}

// loadRun is one idemload invocation and its summary output.
type loadRun struct {
	args   []string
	output string
}

func runIdemload(c config) ([]loadRun, error) {
	bin := filepath.Join(os.TempDir(), fmt.Sprintf("idemload-%d", os.Getpid()))
	build := exec.Command("go", "build", "-o", bin, "./cmd/idemload")
	build.Dir, build.Stderr = c.root, os.Stderr
	if err := build.Run(); err != nil {
		return nil, fmt.Errorf("building idemload: %w", err)
	}
	defer os.Remove(bin)
	common := []string{"-duration", c.duration.String(), "-rounds", fmt.Sprint(c.rounds), "-body", "1024"}
	var runs [][]string
	for _, mix := range []string{"new=70,dup=20,concdup=10", "new=100", "dup=100"} {
		runs = append(runs, append([]string{"-concurrency", "16", "-mix", mix}, common...))
	}
	if c.redis {
		redis := "auto"
		if addr := os.Getenv("REDIS_ADDR"); addr != "" {
			redis = addr
		}
		for _, conc := range []string{"1", "64"} {
			for _, mix := range []string{"new=100", "dup=100"} {
				runs = append(runs, append([]string{"-redis", redis, "-concurrency", conc, "-mix", mix}, common...))
			}
		}
		runs = append(runs, append([]string{"-redis", redis, "-concurrency", "16", "-mix", "new=70,dup=20,concdup=10"}, common...))
	}
	var out []loadRun
	for _, args := range runs {
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

// machineInfo describes where the numbers were measured.
type machineInfo struct {
	cpu, kernel, goVersion, redis string
	cores                         int
	load                          string
	generated                     time.Time // when the measuring ended
}

func machine(c config) machineInfo {
	m := machineInfo{cores: runtime.NumCPU(), goVersion: runtime.Version(), generated: time.Now().UTC()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	if out, err := exec.Command("uname", "-sr").Output(); err == nil {
		m.kernel = strings.TrimSpace(string(out))
	}
	if out, err := exec.Command("go", "version").Output(); err == nil {
		m.goVersion = strings.TrimSpace(string(out))
	}
	if c.redis {
		if out, err := exec.Command("redis-server", "--version").Output(); err == nil {
			m.redis = strings.TrimSpace(string(out))
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		m.load = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	return m
}

// runPeers runs the side-by-side comparison in benchmarks/peers (a module
// of its own) and returns its output, also kept as results/peers.txt.
func runPeers(c config, resDir string) (string, error) {
	// Twice as many rounds of half the time: the same time in all, and a
	// median over more alternations of the two targets, which drifts less
	// with the machine's load.
	args := []string{"run", ".", "-duration", (c.duration / 2).String(), "-rounds", fmt.Sprint(2*c.rounds + 1)}
	if c.quick {
		args = []string{"run", ".", "-duration", "300ms", "-rounds", "1"}
	}
	fmt.Fprintf(os.Stderr, "report: (benchmarks/peers) go %s\n", strings.Join(args, " "))
	cmd := exec.Command("go", args...)
	cmd.Dir = filepath.Join(c.root, "benchmarks", "peers")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("benchmarks/peers: %w", err)
	}
	return string(out), os.WriteFile(filepath.Join(resDir, "peers.txt"), out, 0o644)
}
