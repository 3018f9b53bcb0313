// Package relaytest is the conformance suite of package outbox/relay on a
// database engine: what a relay does with the messages of one outbox
// table, whatever engine keeps it. It publishes each committed message
// and marks it done, once; several relays, in one process or in several,
// partition a table; a failing sink backs off, then the message is dead at
// the cap; a key's messages are presented in order, under retries and
// across relays; a relay cut from its database gives its claim up before
// another relay can take it back, and its late marks are fenced; a claim
// is kept while its sink works, and given up when an operator cancels or
// suspends the message; a row the relay cannot read is set apart; a
// batch sink's outcomes are marked one by one; a commit wakes the relay
// without its poll; and the relay reports and logs each of these.
//
// An engine's tests call Run from an ordinary test, handing it a function
// that returns a Target on an outbox of its own, empty, for each subtest:
//
//	func TestRelayConformance(t *testing.T) {
//		relaytest.Run(t, func(t *testing.T) relaytest.Target {
//			db := ... // a database of its own, migrated (pgstore.Migrate)
//			return relaytest.Target{
//				Engine:       "postgres",
//				NewRelay:     func(sink outbox.Sink, opts ...relay.Option) *relay.Relay { return relay.New(db, sink, opts...) },
//				NewPeerRelay: ..., // relay.New on a pool of its own
//				Runner:       idempotency.NewRunner(pgstore.New(db), idempotency.WithTransaction(true)),
//				DB:           lifecycle.Pgx(db),
//				Table:        table, // outbox.Table(pgstore.DefaultOutboxTable)
//				WriteHeaders: ..., // an UPDATE of the row's headers
//			}
//		})
//	}
//
// Each check is a named subtest, so that one can be run alone:
//
//	go test -run 'TestRelayConformance/Claims/FencedAfterTakeover' ./outbox/relay
//
// The subtests run one after the other: they hold claims for leases of a
// few hundred milliseconds, and measure how soon a commit is published.
// The whole suite takes about half a minute with the race detector.
package relaytest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/outboxtest"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/outbox/relay"
)

// Target is what the suite needs of an engine, for one subtest: an outbox
// table of its own, empty, and the ways to publish, fill and read it.
type Target struct {
	// Engine names the engine in the suite's reliability reports
	// ("postgres", "sqlite").
	Engine string
	// NewRelay returns a relay on the outbox through sink with opts, as
	// the engine's constructor makes it (relay.New, sqlitestore's
	// Store.Relay): woken when a call of Runner commits messages.
	NewRelay func(sink outbox.Sink, opts ...relay.Option) *relay.Relay
	// NewPeerRelay returns a relay on the same outbox through a handle
	// of its own, as another process runs one (relay.New on a pool of its
	// own, sqlitestore's Store.Relay of another Store on the file). It may
	// find Runner's commits by its poll only.
	NewPeerRelay func(sink outbox.Sink, opts ...relay.Option) *relay.Relay
	// Runner is a transactional Runner (idempotency.WithTransaction(true))
	// over the engine's TxStore, whose calls' messages (outbox.Enqueue)
	// are committed to the outbox.
	Runner *idempotency.Runner
	// DB and Table are the outbox as package lifecycle's edges take it:
	// the suite reads the messages through them (Table.Lookup, List,
	// Status), takes the edges of an operator (Cancel, Suspend, Resume,
	// Schedule) and of a relay's (Claim, Retry, Done), and runs relays of
	// its own on DB (relay.NewDB, polling), one of which it cuts from the
	// database by stalling its statements.
	DB    lifecycle.DB
	Table *lifecycle.Table
	// WriteHeaders writes headers, as they are, into the headers column
	// of the message id, as another producer might: the suite writes JSON
	// that is not an object of strings, which a relay cannot read.
	WriteHeaders func(ctx context.Context, id, headers string) error
}

// Run runs the conformance suite against the targets newTarget returns,
// one for each subtest, called with that subtest's *testing.T.
func Run(t *testing.T, newTarget func(t *testing.T) Target) {
	t.Helper()
	groups := []struct {
		name  string
		tests []test
	}{
		{"Publish", publishTests},
		{"Failures", failureTests},
		{"Claims", claimTests},
		{"Operator", operatorTests},
		{"Batch", batchTests},
		{"Wake", wakeTests},
		{"Log", logTests},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			for _, tc := range g.tests {
				t.Run(tc.name, func(t *testing.T) {
					tc.run(t, newTarget(t))
				})
			}
		})
	}
}

// test is one subtest of a group.
type test struct {
	name string
	run  func(t *testing.T, tg Target)
}

var ctx = context.Background()

// events collects a relay's events (see outboxtest.Events), and the
// time each kind was first reported at.
type events struct {
	*outboxtest.Events
	mu    sync.Mutex
	first map[relay.EventKind]time.Time
	kinds []relay.EventKind // of every event, in order
}

func newEvents() *events {
	return &events{Events: outboxtest.NewEvents(), first: map[relay.EventKind]time.Time{}}
}

// Observe records ev: it is a relay.WithObserver function.
func (e *events) Observe(ctx context.Context, ev relay.Event) {
	e.mu.Lock()
	if _, ok := e.first[ev.Kind]; !ok {
		e.first[ev.Kind] = time.Now()
	}
	e.kinds = append(e.kinds, ev.Kind)
	e.mu.Unlock()
	e.Events.Observe(ctx, ev)
}

// after reports whether an event of kind then was reported after the
// n-th event of kind k (from 1).
func (e *events) after(k relay.EventKind, n int, then relay.EventKind) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, kind := range e.kinds {
		if kind == k {
			if n--; n == 0 {
				return slices.Contains(e.kinds[i+1:], then)
			}
		}
	}
	return false
}

// firstAt returns when the first event of kind k was reported (the zero
// time before).
func (e *events) firstAt(k relay.EventKind) time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.first[k]
}

// start runs the relay newRelay returns for sink until t ends, with a
// fast backoff unless opts set one, and returns its events.
func start(t *testing.T, newRelay func(outbox.Sink, ...relay.Option) *relay.Relay, sink outbox.Sink, opts ...relay.Option) *events {
	t.Helper()
	ev := newEvents()
	outboxtest.Start(t, func(o ...relay.Option) *relay.Relay {
		// The last observer is the relay's: ev's, rather than Start's.
		return newRelay(sink, append(o, relay.WithObserver(ev.Observe))...)
	}, opts...)
	return ev
}

// runUntilEnd runs r until t ends, and then checks that Run returned
// context.Canceled.
func runUntilEnd(t *testing.T, r *relay.Relay) {
	t.Helper()
	outboxtest.Start(t, func(...relay.Option) *relay.Relay { return r })
}

// tryEnqueue runs a transactional call of the target's Runner with key (a
// fresh record) that enqueues msgs, and returns their IDs once it
// committed.
func tryEnqueue(ctx context.Context, tg Target, key string, msgs ...outbox.Message) ([]string, error) {
	res, err := idempotency.Do(ctx, tg.Runner, idempotency.Call{Name: "relaytest.enqueue", Key: key}, func(ctx context.Context) ([]string, error) {
		return outbox.Enqueue(ctx, msgs...)
	})
	if err == nil && res.Replayed {
		err = errors.New("relaytest: the key " + key + " was used before")
	}
	return res.Value, err
}

// enqueue is tryEnqueue for the test's goroutine: it fails t on an error.
func enqueue(t *testing.T, tg Target, key string, msgs ...outbox.Message) []string {
	t.Helper()
	ids, err := tryEnqueue(ctx, tg, key, msgs...)
	if err != nil {
		t.Fatalf("enqueue under key %s: %v", key, err)
	}
	return ids
}

// enqueueN enqueues n records of perRecord messages each (topic "t",
// payload "<record>/<message>"), and returns the IDs.
func enqueueN(t *testing.T, tg Target, prefix string, n, perRecord int) []string {
	t.Helper()
	var ids []string
	for i := range n {
		msgs := make([]outbox.Message, perRecord)
		for j := range msgs {
			msgs[j] = outbox.Message{Topic: "t", Payload: fmt.Appendf(nil, "%d/%d", i, j)}
		}
		ids = append(ids, enqueue(t, tg, fmt.Sprintf("%s-%d", prefix, i), msgs...)...)
	}
	return ids
}

// row is a message as the tests look at it.
type row struct {
	// RowID is the message's row: the order in which the relays present
	// the messages of an ordering key.
	RowID      int64
	State      lifecycle.State
	Attempts   int
	LastError  *string
	FinishedAt *time.Time
	// ClaimedBy is the relay that claimed it last, "" when none did.
	ClaimedBy string
}

func (r row) String() string {
	return fmt.Sprintf("{row %d: %s, %d attempts, last error %q, claimed by %q, finished %v}", r.RowID, r.State, r.Attempts, r.lastError(), r.ClaimedBy, r.FinishedAt != nil)
}

// lastError returns the row's last_error, "" for none.
func (r row) lastError() string {
	if r.LastError == nil {
		return ""
	}
	return *r.LastError
}

// rowOf returns the message id, and false when it is not in the table.
// It reads no payload nor headers, so that it reads a row a relay cannot.
func rowOf(t *testing.T, tg Target, id string) (row, bool) {
	t.Helper()
	// The message may change state between the two reads: read again.
	for range 10 {
		found, err := tg.Table.Lookup(ctx, tg.DB, []string{id})
		if err != nil {
			t.Fatal(err)
		}
		f, ok := found[id]
		if !ok {
			return row{}, false
		}
		listed, err := tg.Table.List(ctx, tg.DB, f.State, "", 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range listed {
			if m.ID == id {
				return row{RowID: f.RowID, State: f.State, Attempts: m.Attempts, LastError: m.LastError, FinishedAt: m.FinishedAt, ClaimedBy: f.ClaimedBy}, true
			}
		}
	}
	t.Fatalf("message %s changed state at every read", id)
	return row{}, false
}

// mustRow returns the message id, failing t when it is not in the table.
func mustRow(t *testing.T, tg Target, id string) row {
	t.Helper()
	r, ok := rowOf(t, tg, id)
	if !ok {
		t.Fatalf("no message %s in the table", id)
	}
	return r
}

// statuses counts the messages by state, leaving out the states none is
// in.
func statuses(t *testing.T, tg Target) map[lifecycle.State]int {
	t.Helper()
	st, err := tg.Table.Status(ctx, tg.DB, 1)
	if err != nil {
		t.Fatal(err)
	}
	m := map[lifecycle.State]int{}
	for s, n := range st.Counts {
		if n > 0 {
			m[s] = int(n)
		}
	}
	return m
}

// awaitAllDone waits until every message of the table is done, for at
// most d, and fails t otherwise.
func awaitAllDone(t *testing.T, tg Target, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		st := statuses(t, tg)
		if len(st) == 0 || len(st) == 1 && st[lifecycle.Done] > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("messages not all done after %v: %v", d, st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
