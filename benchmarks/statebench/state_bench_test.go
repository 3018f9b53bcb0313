package statebench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/benchmarks/load"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/pgstore"
	"github.com/go-idempotency/idempotency/state"
)

var ctx = context.Background()

// records is how many records each side moves, in turn: enough that no
// row is hot, few enough to stay in the buffers.
const records = 64

const machine = "bench.payment"

// floorSQL is the floor: the compare-and-swap as it is written by hand,
// and the event's outbox row, in one statement.
//
//	$1 $2 $3 the record; $4 from; $5 to; $6 the expected version; $7 the
//	event's storage key; $8 topic; $9 payload; $10 ordering key
const floorSQL = `
WITH moved AS (
	UPDATE idempotency_state
	SET state = $5, version = version + 1, updated_at = clock_timestamp()
	WHERE scope = $1 AND machine = $2 AND id = $3 AND state = $4 AND version = $6
	RETURNING version, updated_at
)
INSERT INTO idempotency_outbox (storage_key, seq, topic, payload, headers, ordering_key, status, enqueued_at, due_at)
SELECT $7, version, $8, $9, '{}', $10, 'ready', updated_at, updated_at FROM moved
RETURNING seq`

// floorHistorySQL is floorSQL with the history's row.
const floorHistorySQL = `
WITH moved AS (
	UPDATE idempotency_state
	SET state = $5, version = version + 1, updated_at = clock_timestamp()
	WHERE scope = $1 AND machine = $2 AND id = $3 AND state = $4 AND version = $6
	RETURNING version, updated_at
),
history AS (
	INSERT INTO idempotency_state_history (key, version, from_state, to_state, cause, at)
	SELECT $7, version, $4, $5, '{}', updated_at FROM moved
)
INSERT INTO idempotency_outbox (storage_key, seq, topic, payload, headers, ordering_key, status, enqueued_at, due_at)
SELECT $7, version, $8, $9, '{}', $10, 'ready', updated_at, updated_at FROM moved
RETURNING seq`

// floorNotifySQL is floorHistorySQL with the relays' wake-up: by hand,
// all that a Store's transition does.
const floorNotifySQL = `
WITH moved AS (
	UPDATE idempotency_state
	SET state = $5, version = version + 1, updated_at = clock_timestamp()
	WHERE scope = $1 AND machine = $2 AND id = $3 AND state = $4 AND version = $6
	RETURNING version, updated_at
),
history AS (
	INSERT INTO idempotency_state_history (key, version, from_state, to_state, cause, at)
	SELECT $7, version, $4, $5, '{}', updated_at FROM moved
),
event AS (
	INSERT INTO idempotency_outbox (storage_key, seq, topic, payload, headers, ordering_key, status, enqueued_at, due_at)
	SELECT $7, version, $8, $9, '{}', $10, 'ready', updated_at, updated_at FROM moved
	RETURNING seq
)
SELECT seq, pg_notify('idempotency_outbox', '') FROM event`

// mover makes one side's transitions on its own records, each moving
// from a to b and back.
type mover struct {
	name     string
	refs     []state.Ref
	versions []int64
	move     func(ref state.Ref, from, to string, version int64) error
	took     []time.Duration
}

// next makes op's transition on its record, timed.
func (m *mover) next(op int) error {
	i := op % len(m.refs)
	v := m.versions[i]
	from, to := "a", "b"
	if v%2 == 0 {
		from, to = to, from
	}
	start := time.Now()
	if err := m.move(m.refs[i], from, to, v); err != nil {
		return fmt.Errorf("%s: %w", m.name, err)
	}
	m.took = append(m.took, time.Since(start))
	m.versions[i]++
	return nil
}

// newDatabase returns a pool on a database of its own, migrated.
func newDatabase(b *testing.B) *pgxpool.Pool {
	b.Helper()
	pool := pgtest.Pool(b, func(c *pgxpool.Config) { c.MaxConns = 8 })
	if err := pgstore.Migrate(ctx, pool); err != nil {
		b.Fatal(err)
	}
	return pool
}

// newMover creates records records of its own for a side named name.
func newMover(b *testing.B, s *state.Store, name string, move func(ref state.Ref, from, to string, version int64) error) *mover {
	b.Helper()
	m := &mover{name: name, move: move}
	for i := range records {
		ref := state.Ref{Scope: "bench", Machine: machine, ID: fmt.Sprint(name, "-", i)}
		if _, err := s.Create(ctx, ref, "a", []byte(`{"amount":1999,"currency":"EUR"}`)); err != nil {
			b.Fatal(err)
		}
		m.refs, m.versions = append(m.refs, ref), append(m.versions, 1)
	}
	return m
}

// BenchmarkTransition: see the package's documentation.
func BenchmarkTransition(b *testing.B) {
	pool := newDatabase(b)
	s := state.New(pool)
	quiet := state.PostgreSQL
	quiet.Notify = nil
	sq := state.NewDB(lifecycle.Pgx(pool), quiet)

	// The floor's event is the Store's: the same body, the same columns.
	handWritten := func(sql string) func(ref state.Ref, from, to string, version int64) error {
		return func(ref state.Ref, from, to string, version int64) error {
			body, err := json.Marshal(state.Event{ID: state.EventID(ref, version+1), Ref: ref, From: from, To: to, Version: version + 1})
			if err != nil {
				return err
			}
			rows, err := pool.Query(ctx, sql, ref.Scope, ref.Machine, ref.ID, from, to, version,
				state.EventKey(ref), s.Topic(ref.Machine), body, state.OrderingKey(ref))
			if err != nil {
				return err
			}
			rows.Close()
			return rows.Err()
		}
	}
	store := func(s *state.Store) func(ref state.Ref, from, to string, version int64) error {
		return func(ref state.Ref, from, to string, version int64) error {
			_, err := s.Transition(ctx, ref, state.Change{From: from, To: to, ExpectedVersion: version})
			return err
		}
	}
	sides := []*mover{
		newMover(b, s, "floor", handWritten(floorSQL)),
		newMover(b, s, "floor+history", handWritten(floorHistorySQL)),
		newMover(b, s, "floor+history+notify", handWritten(floorNotifySQL)),
		newMover(b, s, "state-without-notify", store(sq)),
		newMover(b, s, "state", store(s)),
	}
	if _, err := pool.Exec(ctx, "ANALYZE"); err != nil {
		b.Fatal(err)
	}
	// A round of each, unmeasured: prepared statements, warm buffers.
	for op := range records {
		for _, m := range sides {
			if err := m.next(op); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, m := range sides {
		m.took = m.took[:0]
	}
	b.ResetTimer()
	for op := range b.N {
		for k := range sides {
			if err := sides[(op+k)%len(sides)].next(op); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	report(b, sides, "transition")
	floor, hand, st := sides[0], sides[2], sides[4]
	b.ReportMetric(float64(median(st.took))/float64(median(floor.took)), "x-floor(p50)")
	b.ReportMetric(float64(mean(st.took))/float64(mean(floor.took)), "x-floor(mean)")
	b.ReportMetric(float64(median(st.took))/float64(median(hand.took)), "x-by-hand(p50)")
}

// BenchmarkRouteTransition: see the package's documentation.
func BenchmarkRouteTransition(b *testing.B) {
	pool := newDatabase(b)
	if _, err := pool.Exec(ctx, `CREATE TABLE payments (id bigserial PRIMARY KEY, key text NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	idem := pgstore.New(pool)
	b.Cleanup(func() { idem.Close() })
	s := state.New(pool)
	mw := idempotency.New(idem, idempotency.WithTransaction(true))

	// The transition route moves the record and from the state and
	// version the request names, as a client that read them would.
	m := newMover(b, s, "route", nil)
	route := func(transition bool) http.Handler {
		return mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			info, _ := idempotency.FromContext(r.Context())
			tx, _ := pgstore.TxFromContext(r.Context())
			if _, err := tx.Exec(r.Context(), `INSERT INTO payments (key) VALUES ($1)`, info.Key); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			if transition {
				q := r.URL.Query()
				version, _ := strconv.ParseInt(q.Get("version"), 10, 64)
				ref := state.Ref{Scope: "bench", Machine: machine, ID: q.Get("id")}
				if _, err := s.Transition(r.Context(), ref, state.Change{From: q.Get("from"), To: q.Get("to"), ExpectedVersion: version}); err != nil {
					state.WriteError(w, r, err)
					return
				}
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"id":"pay_1"}`))
		}))
	}
	client := load.NewClient(1)
	b.Cleanup(client.CloseIdleConnections)
	urls := map[string]string{}
	for side, transition := range map[string]bool{"tx": false, "tx+transition": true} {
		srv, err := load.Serve(route(transition))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { srv.Close() })
		urls[side] = srv.URL + "/payments"
	}
	var seq int
	post := func(side string) func(state.Ref, string, string, int64) error {
		return func(ref state.Ref, from, to string, version int64) error {
			seq++
			q := url.Values{"id": {ref.ID}, "from": {from}, "to": {to}, "version": {strconv.FormatInt(version, 10)}}
			req, err := http.NewRequest(http.MethodPost, urls[side]+"?"+q.Encode(), strings.NewReader(`{"amount":1999,"currency":"EUR"}`))
			if err != nil {
				return err
			}
			req.Header.Set("Idempotency-Key", fmt.Sprint("bench-", seq))
			res, err := client.Do(req)
			if err != nil {
				return err
			}
			_, err = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if err == nil && res.StatusCode != http.StatusCreated {
				err = fmt.Errorf("status %d", res.StatusCode)
			}
			return err
		}
	}
	tx := &mover{name: "tx", refs: m.refs, versions: make([]int64, records), move: post("tx")}
	m.name, m.move = "tx+transition", post("tx+transition")
	sides := []*mover{tx, m}
	run := func(op int) {
		for k := range sides {
			if err := sides[(op+k)%len(sides)].next(op); err != nil {
				b.Fatal(err)
			}
		}
	}
	for op := range records {
		run(op)
	}
	tx.took, m.took = tx.took[:0], m.took[:0]
	b.ResetTimer()
	for op := range b.N {
		run(op)
	}
	b.StopTimer()
	report(b, sides, "request")
	b.ReportMetric(float64(median(m.took)-median(tx.took))/1e3, "µs-added(p50)")
}

// report reports each side's median and mean, in µs per unit.
func report(b *testing.B, sides []*mover, unit string) {
	for _, m := range sides {
		b.ReportMetric(float64(median(m.took))/1e3, fmt.Sprintf("µs/%s(p50,%s)", unit, m.name))
		b.ReportMetric(float64(mean(m.took))/1e3, fmt.Sprintf("µs/%s(mean,%s)", unit, m.name))
	}
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func mean(d []time.Duration) time.Duration {
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	return sum / time.Duration(len(d))
}
