// Package reliability holds the reliability scenarios of the module (as
// tests) and the helpers they share: a Result each scenario reports, written
// as a JSON line to the file named by IDEMPOTENCY_REPORT, from which
// internal/cmd/reliability-report builds the table of RELIABILITY.md.
package reliability

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
)

// ReportEnv names the environment variable holding the path of the file
// that scenarios append their Results to, one JSON object per line. When it
// is unset, Report only logs.
const ReportEnv = "IDEMPOTENCY_REPORT"

// Result is what one scenario run reports.
type Result struct {
	// Scenario names the scenario, for example "fault/cut-during-complete".
	Scenario string `json:"scenario"`
	// Store names the store it ran against: "memstore", "redis",
	// "redis-cluster", "redis-sentinel", "postgres" or "broken".
	Store string `json:"store"`
	// Operations counts the store operations or HTTP requests made.
	Operations int64 `json:"operations"`
	// Faults counts the faults injected (cuts, stalls, restarts,
	// failovers, pauses, corrupt records, hostile inputs).
	Faults int64 `json:"faults"`
	// Violations counts broken guarantees: double executions, wrong
	// replays, non-linearizable histories, 5xx answers the middleware
	// should not give. A passing scenario reports 0, except one that
	// proves a check bites, which reports what it caught in Caught.
	Violations int64 `json:"violations"`
	// Caught counts violations a deliberately broken store committed and
	// the check detected.
	Caught int64 `json:"caught,omitempty"`
	// Note is a short remark, such as which documented outcome occurred.
	Note string `json:"note,omitempty"`
}

var reportMu sync.Mutex

// Report logs r on t and appends it to the file named by ReportEnv, if set.
func Report(t testing.TB, r Result) {
	t.Helper()
	t.Logf("reliability: %s on %s: %d operations, %d faults, %d violations%s",
		r.Scenario, r.Store, r.Operations, r.Faults, r.Violations, noteSuffix(r))
	path := os.Getenv(ReportEnv)
	if path == "" {
		return
	}
	line, err := json.Marshal(r)
	if err != nil {
		t.Errorf("reliability: encoding result: %v", err)
		return
	}
	reportMu.Lock()
	defer reportMu.Unlock()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Errorf("reliability: %v", err)
		return
	}
	defer f.Close()
	if _, err := f.Write(append(line, '\n')); err != nil {
		t.Errorf("reliability: %v", err)
	}
}

func noteSuffix(r Result) string {
	s := ""
	if r.Caught > 0 {
		s += fmt.Sprintf(", %d caught", r.Caught)
	}
	if r.Note != "" {
		s += " (" + r.Note + ")"
	}
	return s
}

// Summarize adds up results of the same scenario and store (as several runs
// or subtests report them) and returns them sorted by scenario and store.
// Notes of the same scenario are joined, without repeats.
func Summarize(results []Result) []Result {
	type id struct{ scenario, store string }
	sums := map[id]*Result{}
	notes := map[id][]string{}
	for _, r := range results {
		k := id{r.Scenario, r.Store}
		s := sums[k]
		if s == nil {
			s = &Result{Scenario: r.Scenario, Store: r.Store}
			sums[k] = s
		}
		s.Operations += r.Operations
		s.Faults += r.Faults
		s.Violations += r.Violations
		s.Caught += r.Caught
		if r.Note != "" && !slices.Contains(notes[k], r.Note) {
			notes[k] = append(notes[k], r.Note)
		}
	}
	out := make([]Result, 0, len(sums))
	for k, s := range sums {
		s.Note = strings.Join(notes[k], "; ")
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b Result) int {
		return cmp.Or(strings.Compare(a.Scenario, b.Scenario), strings.Compare(a.Store, b.Store))
	})
	return out
}
