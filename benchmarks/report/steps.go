package main

import (
	"fmt"
	"path/filepath"
	"strings"
)

// Paths the report works with, relative to the repository root, which is
// the library's module root; slash-separated.
const (
	toolsDir    = "benchmarks"          // the benchmarks module
	resultsDir  = toolsDir + "/results" // raw go test output, report.json and the pages
	plotFile    = toolsDir + "/keycount.svg"
	summaryFile = "BENCHMARKS.md"
)

// A step is one go test run of benchmarks, whose output the report keeps as
// results/<name>.txt.
type step struct {
	name    string   // results/<name>.txt
	tools   bool     // the package is in the benchmarks module, not the library's
	pkg     string   // the package's directory, relative to its module's root
	benches []string // the benchmark functions run
	cpu     string   // -cpu, or "" for the machine's GOMAXPROCS
	// benchtime and quick are -benchtime of a full and of a -quick run; ""
	// leaves go test's one second.
	benchtime, quick string
	once             bool // one sample (-count 1), whatever -count says
	redis            bool // needs a Redis server
	postgres         bool // needs a PostgreSQL server
}

// steps are the go test runs of a report, in order: those of each page.
func steps(c config) []*step {
	var out []*step
	for _, p := range pages {
		for _, s := range p.steps {
			if (!s.redis || c.redis) && (!s.postgres || c.postgres) {
				out = append(out, s)
			}
		}
	}
	return out
}

// args are the arguments of go test after "test" for s.
func (s *step) args(c config) []string {
	pattern := "^" + s.benches[0] + "$"
	if len(s.benches) > 1 {
		pattern = "^(" + strings.Join(s.benches, "|") + ")$"
	}
	args := []string{"-run", "^$", "-benchmem", "-bench", pattern}
	benchtime := s.benchtime
	if c.quick {
		benchtime = s.quick
	}
	if benchtime != "" {
		args = append(args, "-benchtime", benchtime)
	}
	if s.cpu != "" {
		args = append(args, "-cpu", s.cpu)
	}
	count := c.count
	if s.once {
		count = 1
	}
	return append(args, "-count", fmt.Sprint(count), s.pkg)
}

// dir is the directory go test runs s in: its module's root.
func (s *step) dir(root string) string {
	if s.tools {
		return filepath.Join(root, filepath.FromSlash(toolsDir))
	}
	return root
}

// command is the shell command that runs s from the repository root.
func (s *step) command(c config) string {
	return shellCommand(s.tools, "go", append([]string{"test"}, s.args(c)...)...)
}

// shellCommand quotes a command line for sh, prefixed with a cd into the
// benchmarks module when inTools.
func shellCommand(inTools bool, name string, args ...string) string {
	words := []string{name}
	for _, a := range args {
		if strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.,/=:") != "" {
			a = "'" + a + "'"
		}
		words = append(words, a)
	}
	line := strings.Join(words, " ")
	if inTools {
		line = "cd " + toolsDir + " && " + line
	}
	return line
}
