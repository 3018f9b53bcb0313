package main

import (
	"encoding/csv"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// benchstat runs go tool benchstat in the benchmarks module on the results
// file name with args, in the given format ("text" or "csv").
func (d dirs) benchstat(format, name string, args ...string) (string, error) {
	cmd := exec.Command("go", append(append([]string{"tool", "benchstat", "-format", format}, args...), name)...)
	cmd.Dir = d.results
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("benchstat %s %s: %w", strings.Join(args, " "), name, err)
	}
	return string(out), nil
}

// A cell names one median of benchstat's tables: its unit (as benchstat
// prints it: sec/op for ns/op), row and column.
type cell struct{ unit, row, col string }

// procsSuffix is the -GOMAXPROCS suffix go test gives a benchmark's name.
var procsSuffix = regexp.MustCompile(`-\d+$`)

// medians returns the median of every cell of benchstat's tables for the
// results file name, projected by args (-row, -col, ...). Rows lose their
// -GOMAXPROCS suffix and the "*/" that stands for a name projected into
// the columns; a file missing, or without the benchmarks, gives none.
func (d dirs) medians(name string, args ...string) map[cell]float64 {
	out, err := d.benchstat("csv", name, append([]string{"-table", ""}, args...)...)
	if err != nil {
		return map[cell]float64{}
	}
	return parseMedians(out)
}

// parseMedians reads benchstat's CSV output.
func parseMedians(out string) map[cell]float64 {
	m := map[cell]float64{}
	r := csv.NewReader(strings.NewReader(out))
	r.FieldsPerRecord = -1
	records, err := r.ReadAll()
	if err != nil {
		return m
	}
	// Each table is a line of column names, one of units, then its rows.
	var cols, units []string
	for _, rec := range records {
		switch {
		case rec[0] == "" && (cols == nil || units != nil):
			cols, units = rec, nil
		case rec[0] == "":
			units = rec
		case len(rec) > 1 && units != nil && rec[0] != "geomean":
			for i := 1; i < len(rec) && i < len(cols) && i < len(units); i++ {
				if v, err := strconv.ParseFloat(rec[i], 64); err == nil && cols[i] != "" {
					row := strings.TrimPrefix(strings.TrimPrefix(procsSuffix.ReplaceAllString(rec[0], ""), "*"), "/")
					m[cell{units[i], row, cols[i]}] = v
				}
			}
		}
	}
	return m
}
