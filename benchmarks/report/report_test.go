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

// TestSelectSteps: -steps picks the named steps in the report's order,
// and refuses a name that is no step.
func TestSelectSteps(t *testing.T) {
	all := steps(true)
	got, err := selectSteps(all, "sqlite-keycount, http")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].name != "http" || got[1].name != "sqlite-keycount" {
		t.Errorf("picked %v, want http then sqlite-keycount", got)
	}
	if got, err := selectSteps(all, ""); err != nil || len(got) != len(all) {
		t.Errorf("no -steps: %d steps, %v; want all %d", len(got), err, len(all))
	}
	if _, err := selectSteps(all, "http,nosuch"); err == nil || !strings.Contains(err.Error(), "nosuch") {
		t.Errorf("an unknown step: %v", err)
	}
	if _, err := selectSteps(all, ","); err == nil {
		t.Error("no name: no error")
	}
}

// TestNoteSteps: a step run alone gets a line in machine.txt beside the
// full run's, in place of its earlier one, and the pages name it.
func TestNoteSteps(t *testing.T) {
	old := parseMachine("Started: s\nFinished: f\nCPU: c\nStep http: earlier\nStep peers: p\n")
	m := noteSteps(old, [][2]string{
		stepNote("http", [2]string{"t0", "1.0 1.0 1.0"}, [2]string{"t1", "2.0 2.0 2.0"}),
		stepNote("sqlite-keycount", [2]string{"t1", "2.0 2.0 2.0"}, [2]string{"t2", "3.0 3.0 3.0"}),
	})
	var b strings.Builder
	for _, kv := range m {
		b.WriteString(kv[0] + ": " + kv[1] + "\n")
	}
	want := "Started: s\nFinished: f\nCPU: c\nStep peers: p\n" +
		"Step http: t0 to t1, load average 1.0 1.0 1.0 to 2.0 2.0 2.0\n" +
		"Step sqlite-keycount: t1 to t2, load average 2.0 2.0 2.0 to 3.0 3.0 3.0\n"
	if b.String() != want {
		t.Errorf("machine.txt:\n%s\nwant:\n%s", b.String(), want)
	}
	machine := map[string]string{}
	for _, kv := range m {
		machine[kv[0]] = kv[1]
	}
	if got := reruns(machine); !strings.HasPrefix(got, "`http` t0 to t1") || !strings.Contains(got, "; `peers` p; `sqlite-keycount` t1 to t2") {
		t.Errorf("reruns: %s", got)
	}
	if got := reruns(map[string]string{"Started": "s"}); got != "" {
		t.Errorf("reruns of a full run: %q", got)
	}
}

// TestSQLiteBeside: SQLite's time per request beside memstore's and
// PostgreSQL's, and a side missing said so.
func TestSQLiteBeside(t *testing.T) {
	http := map[cell]float64{
		{"sec/op", "sqlite replay 1", "mw"}:       100e-6,
		{"sec/op", "sqlite replay 1", "memstore"}: 50e-6,
		{"sec/op", "sqlite replay 1", "postgres"}: 200e-6,
		{"sec/op", "sqlite tx 1", "mw"}:           1000e-6,
		{"sec/op", "sqlite tx 1", "postgres"}:     2000e-6,
		{"sec/op", "sqlite first 64", "mw"}:       400e-6,
		{"sec/op", "sqlite first 64", "memstore"}: 40e-6,
	}
	want := "1 client, replay: SQLite 100.0 µs, memstore 50.0 µs (2.00×), PostgreSQL 200.0 µs (0.50×); " +
		"transactional route: SQLite 1000.0 µs, PostgreSQL 2000.0 µs (0.50×). " +
		"64 clients, first execution: SQLite 400.0 µs, memstore 40.0 µs (10.00×), PostgreSQL not measured"
	if got := sqliteBeside(http); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if got := sqliteBeside(map[cell]float64{}); got != "" {
		t.Errorf("nothing measured: %q", got)
	}
}
