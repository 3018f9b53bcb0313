package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// benchstatCSV is benchstat -format csv -table ” output: two units, a
// name projected into the columns, and a benchmark without sub-names.
const benchstatCSV = `,floor,,mw,,,
,sec/op,CI,sec/op,CI,vs base,P
replay 1,0.000040,3%,0.000044,2%,+10.00%,p=0.000 n=10
first 1,0.000080,1%,0.000120,2%,+50.00%,p=0.000 n=10
geomean,0.00005,,0.00007,,+20%,
,ServerTime,
,replay-µs,CI
*-2,4.25,∞
,Middleware,
,allocs/op,CI
*/Bare/body=0-2,20,0%
`

func TestParseMedians(t *testing.T) {
	m := parseMedians(benchstatCSV)
	for c, want := range map[cell]float64{
		{"sec/op", "replay 1", "floor"}:            0.000040,
		{"sec/op", "first 1", "mw"}:                0.000120,
		{"replay-µs", "", "ServerTime"}:            4.25,
		{"allocs/op", "Bare/body=0", "Middleware"}: 20,
	} {
		if got, ok := m[c]; !ok || got != want {
			t.Errorf("%+v = %v, %v; want %v", c, got, ok, want)
		}
	}
	if len(m) != 6 {
		t.Errorf("%d medians, want 6: %v", len(m), m)
	}
}

func TestFlat(t *testing.T) {
	at := func(rise float64) func(c, n string) (float64, bool) {
		return func(c, n string) (float64, bool) {
			if n == "1000000" {
				return 100 + rise, true
			}
			return 100, true
		}
	}
	if got := flat(at(9), 0); !strings.HasSuffix(got, "**met**") {
		t.Errorf("a 9%% rise: %s", got)
	}
	if got := flat(at(11), 0); !strings.HasSuffix(got, "**not met**") {
		t.Errorf("an 11%% rise: %s", got)
	}
	if got := flat(at(11), 1000); !strings.HasSuffix(got, "**met**") {
		t.Errorf("an 11 ns rise beside a 1000 ns request: %s", got)
	}
}

func TestRoundTrips(t *testing.T) {
	d := dirs{results: t.TempDir()}
	write := func(s string) {
		if err := os.WriteFile(filepath.Join(d.results, "roundtrips.txt"), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	passed := "--- PASS: TestResponseBeforeStore (0.1s)\n    --- PASS: TestResponseBeforeStore/small (0.0s)\n" +
		"--- PASS: TestRoundTrips (0.1s)\n--- PASS: TestHTTPRoundTrips (0.1s)\n--- PASS: TestRoundTrips (0.1s)\n"
	write(passed + "--- PASS: TestRoundTripsThroughMiddleware (0.1s)\n")
	if got := roundTrips(d); !strings.HasSuffix(got, "**met**") {
		t.Errorf("all passed: %s", got)
	}
	write(passed + "--- SKIP: TestRoundTripsThroughMiddleware (0.0s)\n")
	if got := roundTrips(d); !strings.HasSuffix(got, "**not met**") || !strings.Contains(got, "skip") {
		t.Errorf("one skipped: %s", got)
	}
}
