package main

import (
	"bufio"
	"io"
	"slices"
	"strconv"
	"strings"
)

// results holds the samples of every benchmark row of a set of runs: for
// each name (with its -N GOMAXPROCS suffix as go test prints it), one map
// of unit to value per run.
type results struct {
	order []string
	rows  map[string][]map[string]float64
}

func newResults() *results { return &results{rows: map[string][]map[string]float64{}} }

// parse adds the benchmark lines of go test output to r.
func (r *results) parse(out io.Reader) {
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		m := map[string]float64{}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				break
			}
			m[f[i+1]] = v
		}
		name := f[0]
		if _, ok := r.rows[name]; !ok {
			r.order = append(r.order, name)
		}
		r.rows[name] = append(r.rows[name], m)
	}
}

// stat is the median of a row's samples of one unit and their spread: the
// largest distance of a sample from the median, relative to it.
type stat struct {
	med, spread float64
	n           int
}

func (r *results) get(name, unit string) (stat, bool) {
	var vs []float64
	for _, m := range r.rows[name] {
		if v, ok := m[unit]; ok {
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		return stat{}, false
	}
	slices.Sort(vs)
	med := vs[len(vs)/2]
	if len(vs)%2 == 0 {
		med = (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
	}
	spread := 0.0
	if med != 0 {
		spread = max(med-vs[0], vs[len(vs)-1]-med) / med
	}
	return stat{med: med, spread: spread, n: len(vs)}, true
}

// find returns the first row whose name, without the GOMAXPROCS suffix,
// is base, trying the suffix "-procs" first and then none.
func (r *results) find(base string, procs int) string {
	if procs > 1 {
		if n := base + "-" + strconv.Itoa(procs); r.rows[n] != nil {
			return n
		}
	}
	if r.rows[base] != nil {
		return base
	}
	return ""
}
