package main

import (
	"encoding/xml"
	"io"
	"math"
	"strings"
	"testing"
)

const sample = `goos: linux
BenchmarkMiddleware/Bare/body=0-2         	 100	       200.0 ns/op	      16 B/op	       1 allocs/op
BenchmarkMiddleware/Bare/body=0-2         	 100	       220.0 ns/op	      16 B/op	       1 allocs/op
BenchmarkMiddleware/Bare/body=0-2         	 100	       300.0 ns/op	      16 B/op	       1 allocs/op
BenchmarkAcquireReplay/Parallel           	 100	       210 ns/op
BenchmarkMiddlewareRedis/Replay/body=0/clients=1-2 	 10	  50000 ns/op	  45.5 p50-µs	 120 p99-µs
PASS
`

func TestParse(t *testing.T) {
	r := newResults()
	r.parse(strings.NewReader(sample))
	s, ok := r.get("BenchmarkMiddleware/Bare/body=0-2", "ns/op")
	if !ok || s.n != 3 || s.med != 220 || math.Abs(s.spread-80.0/220) > 1e-9 {
		t.Fatalf("Bare ns/op = %+v, %v", s, ok)
	}
	if n := r.find("BenchmarkAcquireReplay/Parallel", 2); n != "BenchmarkAcquireReplay/Parallel" {
		t.Fatalf("find without suffix = %q", n)
	}
	if n := r.find("BenchmarkMiddleware/Bare/body=0", 2); n != "BenchmarkMiddleware/Bare/body=0-2" {
		t.Fatalf("find with suffix = %q", n)
	}
	if s, ok := r.get("BenchmarkMiddlewareRedis/Replay/body=0/clients=1-2", "p99-µs"); !ok || s.med != 120 {
		t.Fatalf("p99 = %+v, %v", s, ok)
	}
	if _, ok := r.get("BenchmarkMiddleware/Bare/body=0-2", "p50-µs"); ok {
		t.Fatal("found a unit that was not reported")
	}
}

func TestRatioFromOutput(t *testing.T) {
	out := "target req/s\nbare 100\nfloor 50\nmiddleware 40 1ms 2ms 0  0.40x bare, 0.80x floor\n"
	if v, ok := ratioFromOutput(out, "bare"); !ok || v != 0.40 {
		t.Fatalf("bare = %v, %v", v, ok)
	}
	if v, ok := ratioFromOutput(out, "floor"); !ok || v != 0.80 {
		t.Fatalf("floor = %v, %v", v, ok)
	}
	if _, ok := ratioFromOutput(out, "other"); ok {
		t.Fatal("found a ratio to a target that is not there")
	}
}

func TestKeyCountSVG(t *testing.T) {
	p := panel{title: "a <b>", yLabel: "ns", x: []float64{1e3, 1e4, 1e5, 1e6}, series: []series{
		{name: "replay", color: "#000", y: []float64{100, 120, math.NaN(), 130}},
	}}
	svg := keyCountSVG("t & t", []panel{p, p})
	d := xml.NewDecoder(strings.NewReader(svg))
	circles := 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, svg)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "circle" {
			circles++
		}
	}
	if circles != 6 { // 3 values per panel; NaN is left out
		t.Fatalf("%d points, want 6", circles)
	}
	if niceCeil(130*1.1) != 200 || niceCeil(0.7) != 1 || niceCeil(4000) != 5000 {
		t.Fatal("niceCeil")
	}
}

func TestScaleVerdict(t *testing.T) {
	for _, c := range []struct {
		ok     bool
		ac, rp float64
		bareOK bool
		bare   float64
		want   string
	}{
		{true, 1.7, 1.9, true, 1.8, "**met**"},
		{true, 1.7, 1.9, true, 0.8, "**met**"},     // met whatever the control
		{true, 1.1, 1.9, true, 1.8, "**not met**"}, // the machine scaled, the store did not
		{true, 1.1, 1.9, false, 0, "**not met**"},  // no control measured
		{true, 0.95, 1.97, true, 0.84, "**not shown** (the bare handler did not scale either)"},
		{false, 1.7, 1.9, true, 1.8, "**not met**"}, // rows missing
	} {
		if got := scaleVerdict(c.ok, c.ac, c.rp, c.bareOK, c.bare); got != c.want {
			t.Errorf("scaleVerdict(%v, %v, %v, %v, %v) = %q, want %q", c.ok, c.ac, c.rp, c.bareOK, c.bare, got, c.want)
		}
	}
}

// pgSample has the rows of a PostgreSQL run: one client, every set; 64
// clients, the replay only.
const pgSample = `BenchmarkMiddlewarePostgresPaired/Replay/body=1024 	 300	 900000 ns/op	 100 floor-µs/req	 121 record-µs/req	 130 store-µs/req	 133.1 mw-µs/req	 1.331 mw/floor	 1.1 mw/record	 1.21 record/floor	 1.3 store/floor	 1.024 mw/store
BenchmarkMiddlewarePostgresPaired/FirstExecution/body=1024 	 300	 900000 ns/op	 200 floor-µs/req	 600 record-µs/req	 700 store-µs/req	 780 mw-µs/req	 3.9 mw/floor	 1.3 mw/record	 3 record/floor	 3.5 store/floor	 1.114 mw/store
BenchmarkMiddlewarePostgresPaired/Transaction/body=1024 	 300	 900000 ns/op	 500 floor-µs/req	 550 record-µs/req	 580 store-µs/req	 600 mw-µs/req	 1.2 mw/floor	 1.09 mw/record	 1.1 record/floor	 1.16 store/floor	 1.034 mw/store
BenchmarkMiddlewarePostgresPhased/Replay/body=1024/clients=64 	 2	 900000000 ns/op	 30 floor-µs/req	 40 record-µs/req	 170 store-µs/req	 176 mw-µs/req	 5.8 mw/floor	 4.4 mw/record	 1.33 record/floor	 5.6 store/floor	 1.035 mw/store
`

// TestPostgresTargets: each set is judged by its own ratio (a replay and a
// first execution against the record floor, transactional completion
// against the handler's own transaction), for each number of clients, and
// a set not measured is said so.
func TestPostgresTargets(t *testing.T) {
	r := newResults()
	r.parse(strings.NewReader(pgSample))
	ms := &measured{c: config{count: 1, postgres: true}, res: map[string]*results{pgPairedStep.name: r, pgPhasedStep.name: r}}
	rows := postgresTargets(ms)
	want := []struct{ measured, verdict string }{
		{"1.10× in lockstep", "**met**"},
		{"1.30× in lockstep", "**not met**"},
		{"1.20× in lockstep", "**met**"}, // mw/floor, though mw/record is lower
		{"4.40× in alternating phases", "**not met**"},
		{"not measured", "–"},
		{"not measured", "–"},
	}
	if len(rows) != len(want)+1 {
		t.Fatalf("%d rows, want %d: %q", len(rows), len(want)+1, rows)
	}
	for i, w := range want {
		if !strings.HasPrefix(rows[i][1], w.measured) || rows[i][2] != w.verdict {
			t.Errorf("row %d (%s): %q, %q; want %q…, %q", i, rows[i][0], rows[i][1], rows[i][2], w.measured, w.verdict)
		}
	}
	if !strings.Contains(rows[1][1], "adds +11% to the store's own calls") || !strings.Contains(rows[2][1], "record floor of a transactional store") {
		t.Errorf("details: %q; %q", rows[1][1], rows[2][1])
	}
	page := ms.page(&postgresPage)
	for _, s := range []string{"## One client, in lockstep", "| replay (Floor1, Record1, Store1, Replay) | 100 | 121 | 130 | 133 | 1.33 | 1.10 |", "## 64 clients, in alternating phases"} {
		if !strings.Contains(page, s) {
			t.Errorf("the page has no %q:\n%s", s, page)
		}
	}
	if none := (&measured{res: map[string]*results{}}); postgresTargets(none) != nil || !strings.Contains(none.page(&postgresPage), "Not measured") {
		t.Error("a run without PostgreSQL has targets, or a page that does not say so")
	}
}

func TestLatencyFromOutput(t *testing.T) {
	out := "middleware        5739   149.7µs   498.1µs        0  0.17x bare, 0.74x floor, 0.60x flushfloor\n" +
		"middleware latency ratio p50/p99: 7.53x/3.55x bare, 1.56x/1.23x floor, 1.83x/2.38x flushfloor\n"
	for _, c := range []struct {
		target   string
		p50, p99 float64
		ok       bool
	}{
		{"bare", 7.53, 3.55, true},
		{"floor", 1.56, 1.23, true},
		{"flushfloor", 1.83, 2.38, true},
		{"middleware", 0, 0, false},
	} {
		p50, p99, ok := latencyFromOutput(out, c.target)
		if p50 != c.p50 || p99 != c.p99 || ok != c.ok {
			t.Errorf("%s: %v %v %v; want %v %v %v", c.target, p50, p99, ok, c.p50, c.p99, c.ok)
		}
	}
	if v, ok := ratioFromOutput(out, "floor"); !ok || v != 0.74 {
		t.Errorf("throughput ratio to floor: %v %v; want 0.74", v, ok)
	}
}
