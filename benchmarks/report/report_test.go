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
