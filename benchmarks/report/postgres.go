package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency/internal/pgtest"
)

// The benchmarks of the PostgreSQL page.
const (
	benchPostgresPaired = "BenchmarkMiddlewarePostgresPaired"
	benchPostgresPhased = "BenchmarkMiddlewarePostgresPhased"
)

// postgresPkg is the package of the PostgreSQL benchmarks, in the
// benchmarks module.
const postgresPkg = "./pgbench/"

// An op of BenchmarkMiddlewarePostgresPaired is 4 requests, one per side;
// one of BenchmarkMiddlewarePostgresPhased 4 phases of 64×25 requests.
var (
	pgPairedStep = step{name: "postgres-paired", tools: true, pkg: postgresPkg, benches: []string{benchPostgresPaired}, benchtime: "2000x", quick: "200x", postgres: true}
	pgPhasedStep = step{name: "postgres-phased", tools: true, pkg: postgresPkg, benches: []string{benchPostgresPhased}, benchtime: "4x", quick: "1x", postgres: true}
)

var postgresPage = page{
	file:    "postgres.md",
	title:   "PostgreSQL",
	about:   "the middleware on pgstore beside plain pgx statements on a table of the store's schema, with one client in lockstep and 64 in alternating phases; transactional completion beside the handler's own transaction",
	steps:   []*step{&pgPairedStep, &pgPhasedStep},
	targets: postgresTargets,
	body:    postgresBody,
}

// pgReplayKeys is how many COMPLETE records each replay side of the
// PostgreSQL benchmarks reads in turn (replayKeys in pgbench).
const pgReplayKeys = 256

// postgresLimit is the target: the middleware's time per request at most
// this many times its floor's.
const postgresLimit = 1.25

// pgSet is a set of sides of the PostgreSQL benchmarks (the sub-benchmark
// named after it), and the floor the target judges it against.
type pgSet struct {
	name, what string
	sides      [4]string // floor, record floor, store alone, middleware
	judged     string    // the ratio judged: mw/record or mw/floor
	floor      string    // the judged floor, for the targets table
}

var pgSets = []pgSet{
	{"Replay", "replay", [4]string{"Floor1", "Record1", "Store1", "Replay"}, "mw/record",
		"one `SELECT` by primary key of a row holding a 1 KiB payload"},
	{"FirstExecution", "first execution", [4]string{"Floor2", "Record2", "Store2", "FirstExecution"}, "mw/record",
		"the handler between one `INSERT` of a row of the store's schema and one `UPDATE` storing the payload in it"},
	{"Transaction", "transactional completion", [4]string{"TxOwn", "TxRecord", "TxStore", "TxMiddleware"}, "mw/floor",
		"the same handler writing its payment row in a transaction of its own: `BEGIN`, `INSERT`, `COMMIT`"},
}

// pgRun is one of the side-by-side benchmarks, for a number of clients.
type pgRun struct {
	step        *step
	suffix      string // of its rows: <benchmark>/<set>/body=1024<suffix>
	clients     int
	how         string // how the rows were run, for the targets table
	title, text string
}

var pgRuns = []*pgRun{
	{&pgPairedStep, "", 1, "in lockstep", "One client, in lockstep",
		"`" + benchPostgresPaired + "`: one client sends, op after op, one request to each side of a set, in an order that rotates, so that the four see the same background load; the table gives the mean time of each side and their ratios. One untimed request per side comes first, so that the connection has prepared every statement."},
	{&pgPhasedStep, "/clients=64", 64, "in alternating phases", "64 clients, in alternating phases",
		"`" + benchPostgresPhased + "`: each op runs four phases, one per side, in an order that rotates; in each phase 64 goroutines send 25 requests each, over a pool of 64 connections. Phases last a fraction of a second, so the four see the same background load; the table gives the time per request of each side (wall time of its phases over their requests: the inverse of throughput) and their ratios. One untimed phase per side comes first, so that the connections exist and have prepared the statements. Benchmark process and PostgreSQL share the two cores, so these are ratios of the CPU time both spend per request."},
}

// get returns the median of unit in the row of set name.
func (r *pgRun) get(ms *measured, name, unit string) (stat, bool) {
	return val(ms.of(r.step), fmt.Sprintf("%s/%s/body=%d%s", r.step.benches[0], name, 1<<10, r.suffix), procs, unit)
}

func postgresTargets(ms *measured) [][]string {
	if ms.of(&pgPairedStep) == nil && ms.of(&pgPhasedStep) == nil {
		return nil
	}
	var rows [][]string
	for _, r := range pgRuns {
		for _, s := range pgSets {
			target := fmt.Sprintf("PostgreSQL, %d client(s), 1 KiB: %s ≤ %.2f× the floor (%s)", r.clients, s.what, postgresLimit, s.floor)
			rows = append(rows, ms.postgresTarget(target, r, s))
		}
	}
	return append(rows, []string{"PostgreSQL round trips: replay 1, first execution 2, transactional completion 4 + the handler's statements",
		"asserted per HTTP request by `TestRoundTripsThroughMiddleware` (pgstore)", "**met** (tests)"})
}

// postgresTarget judges set s as run r measured it.
func (ms *measured) postgresTarget(target string, r *pgRun, s pgSet) []string {
	v, ok := r.get(ms, s.name, s.judged)
	if !ok {
		return []string{target, "not measured", "–"}
	}
	mwStore, _ := r.get(ms, s.name, "mw/store")
	var parts string
	if s.judged == "mw/floor" {
		rec, _ := r.get(ms, s.name, "record/floor")
		mwRec, _ := r.get(ms, s.name, "mw/record")
		parts = fmt.Sprintf("the record floor of a transactional store (an `INSERT`, then `BEGIN`, the handler's `INSERT`, an `UPDATE`, `COMMIT`) is %.2f× it, and the middleware %.2f× that", rec.med, mwRec.med)
	} else {
		rec, _ := r.get(ms, s.name, "record/floor")
		st, _ := r.get(ms, s.name, "store/floor")
		parts = fmt.Sprintf("against a trivial round trip (`SELECT 1`): the record floor %.2f×, the store's own calls %.2f×", rec.med, st.med)
	}
	return []string{target, fmt.Sprintf("%s %s; %s; the middleware adds %+.0f%% to the store's own calls", ratioCell(v), r.how, parts, 100*(mwStore.med-1)), verdict(v.med <= postgresLimit)}
}

func postgresBody(ms *measured, d *doc) {
	if ms.of(&pgPairedStep) == nil && ms.of(&pgPhasedStep) == nil {
		d.para("Not measured in this run: no PostgreSQL server answered at %s or the local default.", pgtest.URLEnv)
		return
	}
	d.para("The middleware on pgstore, in process (no HTTP), against a PostgreSQL server on loopback, beside floors measured in the same run on the same pool. Each run creates a database of its own (internal/pgtest) and drops it. Every side answers the same request with the same response (201 and a 1 KiB JSON body, written by the same handler where a side runs it); they differ only in what they do to give it. Each set has four sides:")
	d.p("- **Replay**: **Floor1** a trivial round trip (`SELECT 1`) and the handler; **Record1**, the floor judged, one `SELECT status, headers, body` by primary key of a COMPLETE row holding the 1 KiB payload, written back as the response; **Store1** the store's own `Acquire` of a COMPLETE record, its response written back; **Replay** the middleware. Each side reads %d records in turn, as retries of many clients would.", pgReplayKeys)
	d.p("- **First execution**: **Floor2** the handler between two trivial round trips; **Record2**, the floor judged, the handler between one `INSERT` of an in-progress row (key, token, fingerprint, lease and TTL deadlines) and one `UPDATE` that stores status, headers and payload in it; **Store2** `Acquire`, the handler, `Complete`; **FirstExecution** the middleware. Each request has a key of its own.")
	d.p("- **Transactional completion**: the handler also inserts a payment row. **TxOwn**, the floor judged, is that handler writing its row in a transaction of its own without the middleware (`BEGIN`, `INSERT`, `COMMIT`); **TxRecord** the record floor of a transactional store (an `INSERT` of an in-progress row, then `BEGIN`, the payment's `INSERT`, an `UPDATE` storing the payload in the record, `COMMIT`); **TxStore** the store's own `Acquire`, `BeginTx` and `Tx.Complete` around the payment's `INSERT`; **TxMiddleware** the middleware with `WithTransaction(true)`, the handler writing through `pgstore.TxFromContext`.")
	d.p("")
	d.para("The record floors write to a table created with `pgstore.Schema`, so their rows have the store's columns and indexes (the primary key, and the index on `expires_at`, which both sides' `UPDATE` moves), and they use pgx's default mode (statements prepared once per connection) as the store does. They check nothing and read the server's clock with `now()`: what the store's statements add (for a replay, the columns and the join to one reading of `clock_timestamp()` that let the acquire's `SELECT` judge the record and call its write function when the record must change; for a first execution, that function's `INSERT ... ON CONFLICT DO UPDATE` and its conditions) and what its Go side adds (encoding and decoding the record) is the gap from the record floor to the store alone; the gap from the store alone to the middleware is the middleware's own work. Commits are as durable as the server's settings make them (see the machine table in the summary): a write's implicit commit waits for the WAL flush under `synchronous_commit = on`.")
	for _, r := range pgRuns {
		ms.pgRunSection(d, r)
	}
}

func (ms *measured) pgRunSection(d *doc, r *pgRun) {
	if ms.of(r.step) == nil {
		return
	}
	d.heading(2, r.title)
	d.commands(ms.c, r.step)
	d.para("%s", r.text)
	var rows [][]string
	for _, s := range pgSets {
		row := []string{fmt.Sprintf("%s (%s, %s, %s, %s)", s.what, s.sides[0], s.sides[1], s.sides[2], s.sides[3])}
		for _, unit := range []string{"floor-µs/req", "record-µs/req", "store-µs/req", "mw-µs/req", "mw/floor", "mw/record", "record/floor", "store/floor", "mw/store"} {
			row = append(row, cell(r.get(ms, s.name, unit)))
		}
		rows = append(rows, row)
	}
	d.table([]string{fmt.Sprintf("1 KiB, %d client(s)", r.clients), "floor µs/req", "record floor µs/req", "store alone µs/req", "middleware µs/req", "middleware / floor", "middleware / record floor", "record floor / floor", "store alone / floor", "middleware / store alone"}, rows)
	d.para("The target judges a replay and a first execution by *middleware / record floor*, transactional completion by *middleware / floor* (its floor is the handler's own transaction), each ≤ %.2f×.", postgresLimit)
}

// postgresServer returns the version of the PostgreSQL server the
// benchmarks use (pgtest.ServerURL) and the settings that decide the cost
// of a commit, or an error when it does not answer.
func postgresServer(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgtest.ServerURL())
	if err != nil {
		return "", fmt.Errorf("no PostgreSQL server at %s (set %s): %w", pgtest.ServerURL(), pgtest.URLEnv, err)
	}
	defer conn.Close(ctx)
	var version, fsync, syncCommit string
	if err := conn.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('fsync'), current_setting('synchronous_commit')`).Scan(&version, &fsync, &syncCommit); err != nil {
		return "", err
	}
	return fmt.Sprintf("PostgreSQL %s (fsync %s, synchronous_commit %s)", version, fsync, syncCommit), nil
}
