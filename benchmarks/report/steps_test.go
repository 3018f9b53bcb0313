package main

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/internal/pgtest"
)

// repoRoot is the repository root, seen from this package's directory.
var repoRoot = filepath.Join("..", "..")

// TestStepsExist: every package a step runs holds the benchmarks it names,
// and the commands the report runs are where it runs them, so that a
// benchmark renamed or moved fails here rather than in a 25-minute run.
func TestStepsExist(t *testing.T) {
	names := map[string]bool{}
	for _, s := range steps(config{redis: true, postgres: true}) {
		if names[s.name] {
			t.Errorf("two steps named %s", s.name)
		}
		names[s.name] = true
		dir := filepath.Join(s.dir(repoRoot), filepath.FromSlash(s.pkg))
		tests, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
		if err != nil || len(tests) == 0 {
			t.Errorf("%s: no test files in %s (%v)", s.name, dir, err)
			continue
		}
		var src strings.Builder
		for _, f := range tests {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			src.Write(b)
		}
		for _, b := range s.benches {
			if !strings.Contains(src.String(), "func "+b+"(b *testing.B)") {
				t.Errorf("%s: no %s in %s", s.name, b, dir)
			}
		}
	}
	// The page's text gives the number of records a replay side reads.
	src, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(toolsDir), filepath.FromSlash(postgresPkg), "middleware_bench_test.go"))
	if err != nil || !strings.Contains(string(src), fmt.Sprintf("const replayKeys = %d\n", pgReplayKeys)) {
		t.Errorf("pgbench's replayKeys is not %d (pgReplayKeys), or the file is not readable (%v)", pgReplayKeys, err)
	}
	for _, pkg := range []string{reportPkg, idemloadPkg, peersPkg} {
		if _, err := os.Stat(filepath.Join(repoRoot, filepath.FromSlash(toolsDir), filepath.FromSlash(pkg), "main.go")); err != nil {
			t.Errorf("command %s: %v", pkg, err)
		}
	}
}

func TestStepCommand(t *testing.T) {
	c := config{count: 5}
	if got, want := middlewareStep.command(c), `go test -run '^$' -benchmem -bench '^BenchmarkMiddleware$' -count 5 .`; got != want {
		t.Errorf("command = %s, want %s", got, want)
	}
	if got, want := memoryStep.command(c), `go test -run '^$' -benchmem -bench '^BenchmarkRecordMemory$' -benchtime 2x -count 1 ./memstore/`; got != want {
		t.Errorf("command = %s, want %s", got, want)
	}
	c.quick = true
	if got, want := redisStep.command(c), `cd benchmarks && go test -run '^$' -benchmem -bench '^BenchmarkMiddlewareRedis$' -benchtime 2000x -count 5 ./redisbench/`; got != want {
		t.Errorf("command = %s, want %s", got, want)
	}
	if got, want := pgPhasedStep.command(c), `cd benchmarks && go test -run '^$' -benchmem -bench '^BenchmarkMiddlewarePostgresPhased$' -benchtime 1x -count 5 ./pgbench/`; got != want {
		t.Errorf("command = %s, want %s", got, want)
	}
	without, withRedis, withPostgres := steps(config{}), steps(config{redis: true}), steps(config{postgres: true})
	for _, s := range without {
		if s.redis || s.postgres {
			t.Errorf("step %s needs a server, but runs without it", s.name)
		}
	}
	for _, s := range withRedis {
		if s.postgres {
			t.Errorf("step %s needs PostgreSQL, but runs without it", s.name)
		}
	}
	if len(without) >= len(withRedis) || len(without) >= len(withPostgres) {
		t.Errorf("%d steps without a server, %d with Redis, %d with PostgreSQL", len(without), len(withRedis), len(withPostgres))
	}
}

// TestLinks: every relative link of the files the report writes points at
// one of them or at a file of the repository.
func TestLinks(t *testing.T) {
	c := config{count: 3, rounds: 2, duration: time.Second, redis: true, postgres: true}
	ms := &measured{c: c, res: map[string]*results{}, peers: "peers output\n",
		loads: []loadRun{{args: []string{"-mix", "new=100"}, output: "middleware 1 0.9x bare"}}}
	for _, s := range steps(c) {
		r := newResults()
		r.parse(strings.NewReader(sample))
		ms.res[s.name] = r
	}
	files := ms.files()
	links := regexp.MustCompile(`\]\(([^)#]*)(#[^)]*)?\)`)
	for name, text := range files {
		if !strings.HasSuffix(name, ".md") {
			continue
		}
		for _, m := range links.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if target == "" {
				continue // an anchor in the same file
			}
			p := path.Join(path.Dir(name), target)
			if _, ok := files[p]; ok {
				continue
			}
			if _, err := os.Stat(filepath.Join(repoRoot, filepath.FromSlash(p))); err != nil {
				t.Errorf("%s links to %s: %v", name, target, err)
			}
		}
	}
	for _, p := range pages {
		if !strings.Contains(files[summaryFile], "]("+link(".", p.path())+")") {
			t.Errorf("%s does not link to %s", summaryFile, p.path())
		}
	}
}

// TestPostgresServer: the report finds the benchmarks' server and names
// its commit settings, or says where it looked.
func TestPostgresServer(t *testing.T) {
	got, err := postgresServer(context.Background())
	if err != nil {
		if !strings.Contains(err.Error(), pgtest.URLEnv) {
			t.Fatalf("the error does not name %s: %v", pgtest.URLEnv, err)
		}
		t.Skip(err)
	}
	if !strings.HasPrefix(got, "PostgreSQL ") || !strings.Contains(got, "synchronous_commit ") {
		t.Fatalf("server %q", got)
	}
}
