// Command report runs the project's benchmarks, the idemload command and
// the peers comparison, and writes from what they measured BENCHMARKS.md,
// the pages of detailed results in benchmarks/results and
// benchmarks/keycount.svg. Run it in the benchmarks module:
//
//	cd benchmarks
//	go run ./report            # about 25 minutes of both cores
//	go run ./report -quick     # one sample per row, shorter runs
//	go run ./report -render    # no measuring: rewrite from the last run's results
//
// The library's benchmarks run in the library's module (the repository
// root), the others in the benchmarks module. The Redis parts need
// redis-server on PATH (a private server is started on a loopback port and
// stopped) or REDIS_ADDR; without either they are left out. The PostgreSQL
// parts need a server at IDEMPOTENCY_POSTGRES_URL or the local one
// (postgres@127.0.0.1:5432, trust authentication), on which each run
// creates a database of its own and drops it; without one they are left
// out. The raw go test output is kept in benchmarks/results/ for
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

// libraryPath is the module path of the library measured.
const libraryPath = "github.com/go-idempotency/idempotency"

// reportPkg is this command, in the benchmarks module.
const reportPkg = "./report"

type config struct {
	count    int
	rounds   int
	duration time.Duration
	quick    bool
	redis    bool
	postgres bool
	render   bool
	resume   bool
}

func main() {
	var c config
	flag.IntVar(&c.count, "count", 5, "samples per benchmark row (go test -count)")
	flag.IntVar(&c.rounds, "rounds", 3, "idemload rounds per run")
	flag.DurationVar(&c.duration, "duration", 2*time.Second, "idemload and peers: measured time per target and round")
	flag.BoolVar(&c.quick, "quick", false, "one sample per row and shorter runs, to check the pipeline")
	flag.BoolVar(&c.render, "render", false, "measure nothing: rewrite BENCHMARKS.md, the pages and the plot from benchmarks/results")
	flag.BoolVar(&c.resume, "resume", false, "take the go test steps from their output in benchmarks/results (of a run that stopped after them) and measure the rest")
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

// repositoryRoot returns the library's module root, as the go command
// resolves it from the benchmarks module, and checks that the benchmarks
// module lies in it where the report expects it.
func repositoryRoot() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", libraryPath+"/"+toolsDir, libraryPath).Output()
	if err != nil {
		return "", fmt.Errorf("go list -m: %w (run the report in the %s module)", err, toolsDir)
	}
	dirs := strings.Fields(string(out))
	if len(dirs) != 2 {
		return "", errors.New("go list -m: no directory for the library (run the report in the " + toolsDir + " module)")
	}
	tools, root := dirs[0], dirs[1]
	if filepath.Join(root, filepath.FromSlash(toolsDir)) != tools {
		return "", fmt.Errorf("the %s module is at %s, not in %s under the library at %s", toolsDir, tools, toolsDir, root)
	}
	return root, nil
}

func run(c config) error {
	root, err := repositoryRoot()
	if err != nil {
		return err
	}
	resDir := filepath.Join(root, filepath.FromSlash(resultsDir))
	if c.render {
		ms, err := loadMeasured(c, resDir)
		if err != nil {
			return err
		}
		if err := ms.write(root); err != nil {
			return err
		}
		fmt.Fprintln(os.Stderr, "report: rewrote", summaryFile, "and its pages from", resDir)
		return nil
	}
	_, lookErr := exec.LookPath("redis-server")
	c.redis = lookErr == nil || os.Getenv("REDIS_ADDR") != ""
	pg, pgErr := postgresServer(context.Background())
	c.postgres = pgErr == nil
	if pgErr != nil {
		fmt.Fprintf(os.Stderr, "report: leaving PostgreSQL out: %v\n", pgErr)
	}
	if err := os.MkdirAll(resDir, 0o755); err != nil {
		return err
	}
	var res map[string]*results
	if c.resume {
		res, err = readSteps(c, resDir)
	} else {
		res, err = runSteps(c, root)
	}
	if err != nil {
		return err
	}
	loads, err := runIdemload(c, root)
	if err != nil {
		return err
	}
	peers, err := runPeers(c, root)
	if err != nil {
		return err
	}
	var scripts *scriptCosts
	if c.redis {
		if scripts, err = measureScripts(context.Background()); err != nil {
			return err
		}
	}
	m := machine(c)
	m.postgres = pg
	ms := &measured{c: c, m: m, res: res, loads: loads, scripts: scripts, peers: peers}
	if err := ms.save(resDir); err != nil {
		return err
	}
	if err := ms.write(root); err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "report: wrote", summaryFile, "and its pages")
	return nil
}

// runSteps runs the go test steps of a report, each in its module, keeps
// their output in results/ and returns it parsed, by step name.
func runSteps(c config, root string) (map[string]*results, error) {
	res := map[string]*results{}
	for _, s := range steps(c) {
		args := append([]string{"test", "-timeout", "30m"}, s.args(c)...)
		fmt.Fprintf(os.Stderr, "report: %s\n", s.command(c))
		start := time.Now()
		cmd := exec.Command("go", args...)
		cmd.Dir = s.dir(root)
		var out bytes.Buffer
		cmd.Stdout = &out
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			os.Stderr.Write(out.Bytes())
			return nil, fmt.Errorf("%s: %w", s.command(c), err)
		}
		fmt.Fprintf(os.Stderr, "report:   %v\n", time.Since(start).Round(time.Second))
		if err := os.WriteFile(filepath.Join(root, filepath.FromSlash(resultsDir), s.name+".txt"), out.Bytes(), 0o644); err != nil {
			return nil, err
		}
		r := newResults()
		r.parse(bytes.NewReader(out.Bytes()))
		res[s.name] = r
	}
	return res, nil
}

// machineInfo describes where the numbers were measured.
type machineInfo struct {
	cpu, kernel, goVersion, redis string
	postgres                      string // version and the settings that decide the cost of a commit
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
