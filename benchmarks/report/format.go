package main

import (
	"fmt"
	"math"
	"runtime"
	"strings"
)

// procs is the GOMAXPROCS suffix of the rows go test prints.
var procs = runtime.GOMAXPROCS(0)

// doc builds the Markdown text of one file.
type doc struct{ strings.Builder }

// p writes one line.
func (d *doc) p(format string, args ...any) { fmt.Fprintf(d, format+"\n", args...) }

// para writes a paragraph: its text and a blank line.
func (d *doc) para(format string, args ...any) {
	d.p(format, args...)
	d.p("")
}

// heading writes a heading of the given level.
func (d *doc) heading(level int, title string) {
	d.para("%s %s", strings.Repeat("#", level), title)
}

// block writes text as a fenced code block.
func (d *doc) block(lang, text string) {
	d.p("```%s", lang)
	d.p("%s", strings.TrimRight(text, "\n"))
	d.para("```")
}

// commands writes the commands that measure steps, as run from the
// repository root.
func (d *doc) commands(c config, steps ...*step) {
	lines := make([]string, len(steps))
	for i, s := range steps {
		lines[i] = s.command(c)
	}
	d.block("sh", strings.Join(lines, "\n"))
}

// table writes a table: the first column left-aligned, the others right.
func (d *doc) table(header []string, rows [][]string) {
	d.p("| %s |", strings.Join(header, " | "))
	seps := make([]string, len(header))
	for i := range seps {
		seps[i] = "---"
		if i > 0 {
			seps[i] = "---:"
		}
	}
	d.p("| %s |", strings.Join(seps, " | "))
	for _, r := range rows {
		d.p("| %s |", strings.Join(r, " | "))
	}
	d.p("")
}

// val returns the median of unit in row base (at GOMAXPROCS p), and false
// when the row was not measured.
func val(r *results, base string, p int, unit string) (stat, bool) {
	if r == nil {
		return stat{}, false
	}
	name := r.find(base, p)
	if name == "" {
		return stat{}, false
	}
	return r.get(name, unit)
}

// num formats v with about three significant digits.
func num(v float64) string {
	switch a := math.Abs(v); {
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// cell formats a median with its spread when there are several samples.
func cell(s stat, ok bool) string {
	if !ok {
		return "–"
	}
	if s.n > 1 && s.spread >= 0.005 {
		return fmt.Sprintf("%s ±%.0f%%", num(s.med), 100*s.spread)
	}
	return num(s.med)
}

// ratioCell formats a median ratio with its spread.
func ratioCell(s stat) string {
	if s.n > 1 && s.spread >= 0.005 {
		return fmt.Sprintf("%.2f× ±%.0f%%", s.med, 100*s.spread)
	}
	return fmt.Sprintf("%.2f×", s.med)
}

// verdict is the verdict cell of a target.
func verdict(met bool) string {
	if met {
		return "**met**"
	}
	return "**not met**"
}

// sizeName formats a body size in bytes.
func sizeName(n int) string {
	switch {
	case n == 0:
		return "0 B"
	case n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

func orDash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}

func joinNums(vs []float64) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = fmt.Sprintf("%.0f", v)
	}
	return strings.Join(parts, " / ")
}
