// Package report is the form of a check's result: a Report of Findings,
// each with a Verdict. Package servercheck (Redis, PostgreSQL) and
// sqlitestore's CheckFile (a SQLite file) return one; package servercheck
// gives these types under the same names. It depends on the standard
// library alone, so that a check of a file links no server's client.
package report

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
)

// Verdict grades one Finding.
type Verdict int

// Verdicts, from the mildest. Info reports a fact without judging it; OK is
// safe; Warn is a risk the stores' READMEs explain (a restart or a failover
// can lose records, so keys can run again); Fail lets a duplicate run a
// handler a second time in ordinary operation, or stops the store from
// working.
const (
	Info Verdict = iota
	OK
	Warn
	Fail
)

var verdictNames = [...]string{"INFO", "OK", "WARN", "FAIL"}

// String returns "INFO", "OK", "WARN" or "FAIL".
func (v Verdict) String() string {
	if v >= 0 && int(v) < len(verdictNames) {
		return verdictNames[v]
	}
	return "Verdict(" + strconv.Itoa(int(v)) + ")"
}

// MarshalText encodes v as its String.
func (v Verdict) MarshalText() ([]byte, error) {
	if v < 0 || int(v) >= len(verdictNames) {
		return nil, fmt.Errorf("servercheck: unknown verdict %d", int(v))
	}
	return []byte(v.String()), nil
}

// UnmarshalText decodes a String of a Verdict, in any case.
func (v *Verdict) UnmarshalText(b []byte) error {
	for i, n := range verdictNames {
		if strings.EqualFold(string(b), n) {
			*v = Verdict(i)
			return nil
		}
	}
	return fmt.Errorf("servercheck: unknown verdict %q", b)
}

// Finding is one item of a Report: what was seen on a node (or on the
// deployment as a whole) and what it means for the store.
type Finding struct {
	// Item names what was checked, such as "maxmemory-policy" or
	// "synchronous_commit" (see servercheck.Redis, servercheck.Postgres and
	// sqlitestore.CheckFile for the items).
	Item string `json:"item"`
	// Node is the address of the Redis node the finding is about, or empty
	// for one about the deployment as a whole (a Cluster's layout) or about
	// a PostgreSQL server.
	Node    string  `json:"node,omitempty"`
	Verdict Verdict `json:"verdict"`
	// Value is what was seen, such as "allkeys-lru".
	Value string `json:"value"`
	// Detail says why it matters and what to do.
	Detail string `json:"detail"`
}

// Report is what a check found, in a fixed order: on Redis,
// deployment-wide findings first, then each node's in address order.
type Report struct {
	Findings []Finding `json:"findings"`
}

// Worst returns the gravest verdict among the findings (Info when there
// are none).
func (r Report) Worst() Verdict {
	w := Info
	for _, f := range r.Findings {
		w = max(w, f.Verdict)
	}
	return w
}

// Log logs what is unsafe in r through logger (slog.Default() when logger
// is nil): each Fail finding at Error and each Warn finding at Warn, with
// the item, node, value and detail as attributes. It logs nothing for OK
// and Info findings, so nothing at all for a safe server.
func (r Report) Log(ctx context.Context, logger *slog.Logger) {
	if logger == nil {
		logger = slog.Default()
	}
	for _, f := range r.Findings {
		level := slog.LevelWarn
		switch f.Verdict {
		case Fail:
			level = slog.LevelError
		case Warn:
		default:
			continue
		}
		attrs := []slog.Attr{slog.String("item", f.Item)}
		if f.Node != "" {
			attrs = append(attrs, slog.String("node", f.Node))
		}
		attrs = append(attrs, slog.String("value", f.Value), slog.String("detail", f.Detail))
		logger.LogAttrs(ctx, level, "servercheck: unsafe server configuration", attrs...)
	}
}
