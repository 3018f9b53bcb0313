// Command reliability-report runs the reliability scenarios and rewrites the
// table of RELIABILITY.md from the results they report.
//
// Run it from the module root:
//
//	go run ./internal/cmd/reliability-report
//
// It runs go test -race -count=1 on the packages that report scenarios
// (./internal/reliability, and the root, memstore, redisstore and pgstore
// packages, whose tests of single faults report too) with
// IDEMPOTENCY_REPORT set to a temporary file (and IDEMPOTENCY_REQUIRE_REDIS=1
// and IDEMPOTENCY_REQUIRE_POSTGRES=1, so that no Redis or PostgreSQL
// scenario is skipped: the PostgreSQL ones need a server, see
// internal/pgtest), adds up the JSON lines the
// scenarios wrote and replaces the text between the table markers of the
// file. IDEMPOTENCY_SOAK, when set, is passed on and lengthens the soaks.
// The file is not changed when a test fails.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/go-idempotency/idempotency/internal/reliability"
)

const (
	beginMarker = "<!-- reliability-table:begin -->"
	endMarker   = "<!-- reliability-table:end -->"
)

func main() {
	file := flag.String("file", "RELIABILITY.md", "the file whose table is rewritten")
	pkgs := flag.String("pkgs", "./internal/reliability/ . ./memstore/ ./redisstore/ ./pgstore/ ./outbox/ ./outbox/relay/", "the packages whose scenarios run")
	flag.Parse()
	if err := run(*file, *pkgs); err != nil {
		fmt.Fprintln(os.Stderr, "reliability-report:", err)
		os.Exit(1)
	}
}

func run(file, pkgs string) error {
	doc, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	begin, end := bytes.Index(doc, []byte(beginMarker)), bytes.Index(doc, []byte(endMarker))
	if begin < 0 || end < begin {
		return fmt.Errorf("%s has no %s ... %s markers", file, beginMarker, endMarker)
	}
	tmp, err := os.CreateTemp("", "idempotency-report-*.jsonl")
	if err != nil {
		return err
	}
	tmp.Close()
	defer os.Remove(tmp.Name())

	args := append([]string{"test", "-race", "-count=1"}, strings.Fields(pkgs)...)
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), reliability.ReportEnv+"="+tmp.Name(), "IDEMPOTENCY_REQUIRE_REDIS=1", "IDEMPOTENCY_REQUIRE_POSTGRES=1")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	fmt.Fprintln(os.Stderr, "running: go", strings.Join(args, " "))
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("the scenarios failed (%v); %s left as it was", err, file)
	}

	results, err := readResults(tmp.Name())
	if err != nil {
		return err
	}
	if len(results) == 0 {
		return fmt.Errorf("the scenarios reported nothing")
	}
	table := render(reliability.Summarize(results))
	var out bytes.Buffer
	out.Write(doc[:begin+len(beginMarker)])
	out.WriteString("\n" + table)
	out.Write(doc[end:])
	if err := os.WriteFile(file, out.Bytes(), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "%s: table rewritten from %d results\n", file, len(results))
	return nil
}

func readResults(path string) ([]reliability.Result, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var results []reliability.Result
	dec := json.NewDecoder(f)
	for dec.More() {
		var r reliability.Result
		if err := dec.Decode(&r); err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
		results = append(results, r)
	}
	return results, nil
}

func render(rows []reliability.Result) string {
	var b strings.Builder
	b.WriteString("| scenario | store | operations | faults injected | violations found | notes |\n")
	b.WriteString("|---|---|--:|--:|--:|---|\n")
	var ops, faults, violations int64
	for _, r := range rows {
		note := r.Note
		if r.Caught > 0 {
			note = strings.TrimPrefix(note+fmt.Sprintf("; the checker caught the broken store (%d)", r.Caught), "; ")
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %s |\n", r.Scenario, r.Store, r.Operations, r.Faults, r.Violations,
			strings.ReplaceAll(note, "|", "/"))
		ops += r.Operations
		faults += r.Faults
		violations += r.Violations
	}
	fmt.Fprintf(&b, "| **total** | | **%d** | **%d** | **%d** | |\n", ops, faults, violations)
	return b.String()
}
