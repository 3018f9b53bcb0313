package servercheck

import "github.com/go-idempotency/idempotency/servercheck/report"

// Verdict grades one Finding (package report's, under the same name).
type Verdict = report.Verdict

// Verdicts, from the mildest. Info reports a fact without judging it; OK is
// safe; Warn is a risk the stores' READMEs explain (a restart or a failover
// can lose records, so keys can run again); Fail lets a duplicate run a
// handler a second time in ordinary operation, or stops the store from
// working.
const (
	Info = report.Info
	OK   = report.OK
	Warn = report.Warn
	Fail = report.Fail
)

// Finding is one item of a Report (package report's, under the same
// name): what was seen on a node (or on the deployment as a whole) and
// what it means for the store.
type Finding = report.Finding

// Report is what a check found (package report's, under the same name).
type Report = report.Report
