package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// snapshotFile, in results/, holds what a run measured besides the go test
// output kept beside it: the machine, the idemload and peers output and the
// server time per script. With it, -render writes BENCHMARKS.md and the
// pages again from a run's results without measuring anything, so that a
// change of the fixed text is checked against the same numbers.
const snapshotFile = "report.json"

type snapshot struct {
	Count    int
	Rounds   int
	Duration time.Duration
	Quick    bool
	Redis    bool
	Postgres bool
	Machine  struct {
		CPU, Kernel, Go, Redis, Load string
		Postgres                     string
		Cores                        int
		Generated                    time.Time
	}
	Loads   []savedLoad
	Scripts []savedScript
	Peers   string
}

// savedLoad is a loadRun, and savedScript a scriptCost, as JSON keeps them.
type (
	savedLoad struct {
		Args   []string
		Output string
	}
	savedScript struct {
		Name     string
		Calls    int
		Commands string
		Usec     float64
	}
)

// measured is everything render needs.
type measured struct {
	c       config
	m       machineInfo
	res     map[string]*results
	loads   []loadRun
	scripts *scriptCosts
	peers   string
}

func (ms *measured) save(resDir string) error {
	var s snapshot
	s.Count, s.Rounds, s.Duration, s.Quick, s.Redis, s.Postgres = ms.c.count, ms.c.rounds, ms.c.duration, ms.c.quick, ms.c.redis, ms.c.postgres
	m := &s.Machine
	m.CPU, m.Kernel, m.Go, m.Redis, m.Postgres, m.Load, m.Cores, m.Generated = ms.m.cpu, ms.m.kernel, ms.m.goVersion, ms.m.redis, ms.m.postgres, ms.m.load, ms.m.cores, ms.m.generated
	for _, l := range ms.loads {
		s.Loads = append(s.Loads, savedLoad{l.args, l.output})
	}
	if ms.scripts != nil {
		for _, r := range ms.scripts.rows {
			s.Scripts = append(s.Scripts, savedScript{r.name, r.calls, r.commands, r.usec})
		}
	}
	s.Peers = ms.peers
	b, err := json.MarshalIndent(&s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(resDir, snapshotFile), append(b, '\n'), 0o644)
}

// loadMeasured reads back a run's results from resDir.
func loadMeasured(c config, resDir string) (*measured, error) {
	b, err := os.ReadFile(filepath.Join(resDir, snapshotFile))
	if err != nil {
		return nil, fmt.Errorf("%w (run the report once without -render)", err)
	}
	var s snapshot
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", snapshotFile, err)
	}
	c.count, c.rounds, c.duration, c.quick, c.redis, c.postgres = s.Count, s.Rounds, s.Duration, s.Quick, s.Redis, s.Postgres
	ms := &measured{c: c, res: map[string]*results{}, peers: s.Peers}
	m := s.Machine
	ms.m = machineInfo{cpu: m.CPU, kernel: m.Kernel, goVersion: m.Go, redis: m.Redis, postgres: m.Postgres, load: m.Load, cores: m.Cores, generated: m.Generated}
	for _, l := range s.Loads {
		ms.loads = append(ms.loads, loadRun{args: l.Args, output: l.Output})
	}
	if s.Scripts != nil {
		ms.scripts = &scriptCosts{}
		for _, r := range s.Scripts {
			ms.scripts.rows = append(ms.scripts.rows, scriptCost{name: r.Name, calls: r.Calls, commands: r.Commands, usec: r.Usec})
		}
	}
	if ms.res, err = readSteps(c, resDir); err != nil {
		return nil, err
	}
	return ms, nil
}

// readSteps parses the output of the go test steps kept in resDir, by step
// name. A step with no output there is left out: it was added after these
// results were measured.
func readSteps(c config, resDir string) (map[string]*results, error) {
	res := map[string]*results{}
	for _, st := range steps(c) {
		f, err := os.Open(filepath.Join(resDir, st.name+".txt"))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		r := newResults()
		r.parse(f)
		f.Close()
		res[st.name] = r
	}
	return res, nil
}

// of returns the results of step s, or nil when it was not run.
func (ms *measured) of(s *step) *results { return ms.res[s.name] }
