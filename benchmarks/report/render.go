package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/go-idempotency/idempotency/internal/pgtest"
)

// A page is one file of detailed results in results/: the tables of one
// subject, the prose that explains them, and the targets they judge.
type page struct {
	file  string // in resultsDir
	title string
	about string  // what it holds, for the list in BENCHMARKS.md
	steps []*step // the go test runs its tables show
	// targets returns the page's rows of the targets table in
	// BENCHMARKS.md, if it has any.
	targets func(ms *measured) [][]string
	// body writes the page below its title and introduction.
	body func(ms *measured, d *doc)
}

// pages are the pages of a report, in the order BENCHMARKS.md lists them
// and judges their targets.
var pages = []*page{&memstorePage, &redisPage, &postgresPage, &keyCountPage, &peersPage, &idemloadPage, &findingsPage}

// path is the page's path from the repository root.
func (p *page) path() string { return resultsDir + "/" + p.file }

// link returns the relative link to target from a file in directory from,
// both relative to the repository root.
func link(from, target string) string {
	rel, err := filepath.Rel(filepath.FromSlash(from), filepath.FromSlash(target))
	if err != nil {
		return target
	}
	return filepath.ToSlash(rel)
}

// files returns the text of every file the report writes, by path from
// the repository root: BENCHMARKS.md, the pages and the key-count plot.
func (ms *measured) files() map[string]string {
	files := map[string]string{summaryFile: ms.summary(), plotFile: ms.keyCountChart()}
	for _, p := range pages {
		files[p.path()] = ms.page(p)
	}
	return files
}

// write writes the files of the report under root, the repository root.
func (ms *measured) write(root string) error {
	for name, text := range ms.files() {
		if err := os.WriteFile(filepath.Join(root, filepath.FromSlash(name)), []byte(text), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// page renders one page of detailed results.
func (ms *measured) page(p *page) string {
	var d doc
	d.heading(1, p.title)
	d.para("Part of [the benchmarks](%s), which give the machine, the targets and a word on noise. Generated from the run of %s; edit `%s/report/` rather than this file.",
		link(resultsDir, summaryFile), ms.m.generated.UTC().Format("2006-01-02 15:04 MST"), toolsDir)
	p.body(ms, &d)
	return d.String()
}

// summary renders BENCHMARKS.md: the machine, the targets and their
// verdicts, the key-count plot, the pages and how to regenerate them.
func (ms *measured) summary() string {
	var d doc
	d.heading(1, "Benchmarks")
	d.para("This file is generated from the last run of the project's benchmarks. The tables behind each verdict are on the pages listed under [Details](#details), beside the raw `go test` output they are rendered from. Edit `%s/report/` rather than this file.", toolsDir)
	ms.machineSection(&d)
	ms.targetsSection(&d)
	ms.keyCountSummary(&d)
	ms.detailsSection(&d)
	regenerateSection(&d)
	return d.String()
}

func (ms *measured) machineSection(d *doc) {
	c, m := ms.c, ms.m
	d.heading(2, "Machine")
	d.table([]string{"", ""}, [][]string{
		{"CPU", m.cpu},
		{"Cores (GOMAXPROCS)", fmt.Sprintf("%d (%d)", m.cores, procs)},
		{"OS", m.kernel},
		{"Go", m.goVersion},
		{"Redis", orDash(m.redis)},
		{"PostgreSQL", orDash(m.postgres)},
		{"Load average at the end", m.load},
		{"Generated", m.generated.UTC().Format("2006-01-02 15:04 MST")},
		{"Samples per row", fmt.Sprintf("%d (`-count`); idemload: %d rounds of %v per target", c.count, c.rounds, c.duration)},
	})
	d.para("**Noise.** The machine is small and shared: other processes run tests at the same time, and client, server, redis-server and PostgreSQL share two cores. A cell shows the median of the samples and, after ±, the largest distance of a sample from it. Ratios are taken between rows of the same run; idemload alternates the targets round by round and reports the median of the rounds' ratios. Differences under about 10%% are within the noise.")
}

func (ms *measured) targetsSection(d *doc) {
	var rows [][]string
	for _, p := range pages {
		if p.targets != nil {
			rows = append(rows, p.targets(ms)...)
		}
	}
	d.heading(2, "Targets")
	d.table([]string{"target", "measured", "verdict"}, rows)
	d.para("Why some targets are not met, and what would move them, is in [%s](%s).", findingsPage.title, link(".", findingsPage.path()))
}

func (ms *measured) detailsSection(d *doc) {
	d.heading(2, "Details")
	for _, p := range pages {
		d.p("- [%s](%s): %s", p.title, link(".", p.path()), p.about)
	}
	d.p("")
	d.para("The raw `go test` output of each run is kept beside them in [`%s/`](%s/), one `.txt` file per command (feed the files of two runs to benchstat to compare them), and the rest of what the run measured in `report.json`.", resultsDir, resultsDir)
}

func regenerateSection(d *doc) {
	d.heading(2, "Regenerating")
	lines := []string{"cd " + toolsDir}
	for _, r := range []struct{ flag, comment string }{
		{"", "every benchmark and idemload: about 25 minutes of both cores"},
		{"-quick", "one sample per row and shorter runs, to check the pipeline"},
		{"-render", "measures nothing: rewrites these files from the last results"},
	} {
		lines = append(lines, fmt.Sprintf("%-26s # %s", strings.TrimSpace("go run "+reportPkg+" "+r.flag), r.comment))
	}
	d.block("sh", strings.Join(lines, "\n"))
	d.para("The library's benchmarks run in the library's module (the repository root), the others in the benchmarks module (`%s/`), which keeps the tools' dependencies out of the library's. The Redis parts need redis-server on PATH (the benchmarks start private servers on loopback ports) or REDIS_ADDR; without either they are left out. The PostgreSQL parts need a server at %s or the local one (postgres@127.0.0.1:5432, trust authentication), on which each run creates a database of its own and drops it; without one they are left out. Each page gives the commands of its tables, to run one alone.", toolsDir, pgtest.URLEnv)
}
