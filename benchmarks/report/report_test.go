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

// TestOutboxCells: the relay's share of the broker's limit is judged on
// JetStream, its time per message against the floor's on both brokers,
// and the CPU cell gives the throughput the CPU time allows.
func TestOutboxCells(t *testing.T) {
	thr := map[cell]float64{}
	put := func(broker, c, side string, rate float64, more ...float64) {
		row := strings.TrimSpace(broker + " " + c)
		thr[cell{"msgs/s", row, side}] = rate
		if len(more) == 3 {
			thr[cell{"proc-cpu-µs/msg", row, side}] = more[0]
			thr[cell{"pg-cpu-µs/msg", row, side}] = more[1]
			thr[cell{"broker-cpu-µs/msg", row, side}] = more[2]
		}
	}
	put("jetstream", "", "limit", 80000)
	put("jetstream", "", "floor", 22000)
	put("jetstream", "1", "relay", 21000, 20, 40, 14)
	put("jetstream", "4", "relay", 20500)
	put("rabbitmq", "", "limit", 13000)
	put("rabbitmq", "", "floor", 9000)
	put("rabbitmq", "1", "relay", 7000)
	put("rabbitmq", "4", "relay", 7100)
	v := map[string]string{}
	outboxThroughput(thr, 2, v)
	if got := v["outbox_limit"]; !strings.Contains(got, "JetStream: relay 21000 msgs/s, the broker's limit 80000 msgs/s: 0.26×") || !strings.HasSuffix(got, "**met**") {
		t.Errorf("limit cell: %s", got)
	}
	if got := v["outbox_floor"]; !strings.Contains(got, "JetStream: relay 21000 msgs/s, floor 22000 msgs/s: 1.05×") ||
		!strings.Contains(got, "RabbitMQ: relay 7000 msgs/s, floor 9000 msgs/s: 1.29×") || !strings.HasSuffix(got, "**not met**") {
		t.Errorf("floor cell: %s", got)
	}
	if got := v["outbox_cpu"]; !strings.Contains(got, "relay 20.0 µs in its process, 40.0 in PostgreSQL, 14.0 in the broker: 74.0 µs, at most 27027 msgs/s on 2 cores") {
		t.Errorf("CPU cell: %s", got)
	}
	if got := v["outbox_river"]; !strings.Contains(got, "JetStream: 1 worker 21000 against 580 (36.2×), 4 workers 21000 against 1941 (10.8×), 100 workers 21000 against 14715 (1.4×)") {
		t.Errorf("River cell: %s", got)
	}
	thr[cell{"msgs/s", "jetstream 1", "relay"}] = 19000 // 0.24×
	outboxThroughput(thr, 2, v)
	if got := v["outbox_limit"]; !strings.HasSuffix(got, "**not met**") {
		t.Errorf("a relay at 0.24× of the limit: %s", got)
	}
}
