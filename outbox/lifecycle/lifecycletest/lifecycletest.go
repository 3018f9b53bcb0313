// Package lifecycletest is the conformance suite of the outbox on a
// database engine: every edge and read-only query of package
// outbox/lifecycle on the engine's table in its Dialect, and outbox.Enqueue
// and outbox.Cancel in the transactions of a transactional Runner over the
// engine's TxStore. The same tests run on every engine; what an engine
// cannot do (two write transactions at once) is a capability of its
// Target, and the tests that need it are skipped without it.
//
// An engine's tests call Run from an ordinary test, handing it a function
// that returns the engine's Target, a table of its own for each call:
//
//	func TestLifecycleConformance(t *testing.T) {
//		lifecycletest.Run(t, func(t *testing.T) lifecycletest.Target {
//			s := ... // a Store on a database (a file) of its own
//			table, err := lifecycle.New("idempotency_outbox", lifecycle.SQLite)
//			...
//			return lifecycletest.Target{DB: s.OutboxDB(), Table: table, Store: s, ClockResolution: time.Millisecond}
//		})
//	}
//
// Run runs both parts of the suite: RunEdges, the edges and queries of
// package lifecycle, and RunOutbox, package outbox's Enqueue and Cancel in
// a route's transaction; a package that tests one of them runs that part
// alone. The groups, each a named subtest, and what they check:
//
//	part     group        checks
//	edges    Enqueue      ready or scheduled by NotBefore, due times, the IDs'
//	                      sequence, ordering keys, payloads and headers
//	                      kept, a second transaction on an ordering key
//	                      waiting for the first, a conflict on an ID
//	         Claim        due messages only, one per ordering key in id
//	                      order (held back by an earlier one scheduled,
//	                      suspended, claimed or waiting), the limit, the
//	                      lease, scheduled messages at their time,
//	                      concurrent claimers partitioning the messages,
//	                      unreadable rows read apart
//	         Marks        extend, release, done, retry (and dead at the
//	                      cap), refuse, unreadable, sink-suspend, each
//	                      fenced by the claim token; text kept as Text
//	         Reclaim      claims run out: waiting for a retry or dead at
//	                      the cap, the relay's marks fenced after it
//	         Operator     suspend and resume by topic, key or ID; schedule;
//	                      cancel; requeue; purge
//	         Reads        RelayState, Status, Lookup (and its lock), States,
//	                      List, Messages and InsertSequenced
//	outbox   Transaction  Enqueue committed with the call or not at all
//	                      (an error, a panic, a refused COMMIT), IDs stable
//	                      across a lost lease (an owner that died, or one
//	                      stalled with its transaction open), the sequence
//	                      continued, invalid messages refused, a NotBefore
//	                      scheduled, Cancel in the call's transaction, no
//	                      transaction refused
//
// Each check is a named subtest, so that one can be run alone:
//
//	go test -run 'TestConformance/Claim/OrderingKey' ./outbox/lifecycle
//
// Run calls newTarget once per subtest, with that subtest's *testing.T,
// and the subtests run in parallel. Each needs an outbox table of its own,
// empty (a database or a file of its own), since a claim, a reclaim and a
// purge act on the whole table. The suite takes a few seconds.
//
// The engines differ where the suite allows it, each difference a field
// of Target: an engine that runs one write transaction at a time (SQLite)
// has no transaction waiting on another's lock (an ordering key's, a
// unique index's, a row Lookup locked) and no record taken over while its
// owner's transaction is open, so the tests of those need
// ConcurrentWriters, and its one writer partitions concurrent claims as
// row locks (SKIP LOCKED) do on PostgreSQL; its clock may be coarser than
// a microsecond (ClockResolution); the rows it cannot read are its own
// (Corruptions); and a COMMIT refused is the engine's own doing
// (FailCommit).
package lifecycletest

import (
	"context"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
)

// Target is what the suite needs of an engine.
type Target struct {
	// DB is the database under test as a pool: each statement runs as a
	// transaction of its own, and lifecycle.InTx(ctx, DB, fn) runs fn in
	// a transaction of its own (DB is a lifecycle.Txer). The suite runs
	// every edge on it, and the statements it writes itself from the
	// dialect's fragments (Dialect.Param, Now, Shift, JSON) to put a row
	// into a state an edge moves it from, or to read a row's columns.
	DB lifecycle.DB
	// Table is the outbox table on DB, in the engine's dialect, empty,
	// with the columns of pgstore/outbox.sql.
	Table *lifecycle.Table
	// Store is the engine's TxStore on the same database, whose
	// transactions' outbox is Table (outbox.Enqueue and outbox.Cancel in
	// a call of a Runner over it with idempotency.WithTransaction(true)
	// write to Table). The suite runs its own Runners over it. RunEdges
	// does not use it.
	Store idempotency.TxStore
	// ConcurrentWriters reports that two write transactions run at once
	// on the engine: a transaction enqueueing on an ordering key waits
	// for another's lock on the key (Dialect.KeyLocks), an insert of a
	// message ID waits for another transaction's uncommitted row of that
	// ID, and an edge waits for the rows another transaction's Lookup
	// locked. When false (SQLite), write transactions run one at a time,
	// so no such wait can be seen, and the tests of them are skipped.
	ConcurrentWriters bool
	// LockWaits, needed with ConcurrentWriters, counts the database's
	// transactions waiting for a lock another holds, so that a test can
	// tell when one is. It is called from goroutines other than the
	// test's too: it reports a failure with t.Error, and returns 0.
	LockWaits func(t *testing.T) int
	// ClockResolution is the resolution of the database's clock
	// (Dialect.Now): a microsecond on PostgreSQL, a millisecond on
	// SQLite. Times the database writes may be that much earlier than
	// the test's own clock.
	ClockResolution time.Duration
	// Corruptions are the engine's own ways of a row that the claim and
	// Messages cannot read (beyond headers that are not a JSON object of
	// strings, which the suite writes itself): each is read apart, with
	// its error, from the other rows.
	Corruptions []Corruption
	// FailCommit, when set, writes in the transaction of the
	// transactional call whose context ctx is something that makes the
	// transaction's COMMIT fail (a row that breaks a deferred
	// constraint); nil when the engine has no way to. RunEdges does not
	// use it.
	FailCommit func(ctx context.Context) error
}

// Corruption is a row the claim and Messages cannot read.
type Corruption struct {
	// Name names it, for the suite's messages.
	Name string
	// Corrupt makes the row of the message at seq of storageKey so.
	Corrupt func(t *testing.T, storageKey string, seq int)
	// Want is a part of the error the claim and Messages read the row
	// with (lifecycle.ClaimedMessage.Err, lifecycle.Sequenced.Err).
	Want string
}

// test is one subtest of a group.
type test struct {
	name string
	run  func(t *testing.T, tg Target)
}

// group is a named group of subtests.
type group struct {
	name  string
	tests []test
}

// Run runs the whole suite against the targets newTarget returns:
// RunEdges and RunOutbox.
func Run(t *testing.T, newTarget func(t *testing.T) Target) {
	t.Helper()
	run(t, newTarget, append(edgeGroups(), outboxGroups()...))
}

// RunEdges runs the suite's groups of the edges and queries of package
// lifecycle (Enqueue, Claim, Marks, Reclaim, Operator, Reads).
func RunEdges(t *testing.T, newTarget func(t *testing.T) Target) {
	t.Helper()
	run(t, newTarget, edgeGroups())
}

// RunOutbox runs the suite's group of outbox.Enqueue and outbox.Cancel in
// a transactional Runner (Transaction).
func RunOutbox(t *testing.T, newTarget func(t *testing.T) Target) {
	t.Helper()
	run(t, newTarget, outboxGroups())
}

func edgeGroups() []group {
	return []group{
		{"Enqueue", enqueueTests},
		{"Claim", claimTests},
		{"Marks", markTests},
		{"Reclaim", reclaimTests},
		{"Operator", operatorTests},
		{"Reads", readTests},
	}
}

func outboxGroups() []group { return []group{{"Transaction", transactionTests}} }

func run(t *testing.T, newTarget func(t *testing.T) Target, groups []group) {
	t.Helper()
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			for _, tc := range g.tests {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					tg := newTarget(t)
					if tg.ConcurrentWriters && tg.LockWaits == nil {
						t.Fatal("lifecycletest: a Target with ConcurrentWriters needs LockWaits")
					}
					tc.run(t, tg)
				})
			}
		})
	}
}

var ctx = context.Background()

// needConcurrentWriters skips t on an engine that runs one write
// transaction at a time.
func needConcurrentWriters(t *testing.T, tg Target, what string) {
	t.Helper()
	if !tg.ConcurrentWriters {
		t.Skipf("the engine runs one write transaction at a time: %s cannot be seen", what)
	}
}

// awaitLockWait waits until a transaction of tg's database waits for a
// lock, for at most 10 seconds, and fails t otherwise, or when the
// statement that should wait ends first (ended receives its error). It
// polls: a wait for a lock is seen only in the database's own statistics.
func awaitLockWait(t *testing.T, tg Target, what string, ended <-chan error) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); tg.LockWaits(t) == 0; {
		select {
		case err := <-ended:
			t.Fatalf("%s ended (%v) without waiting for a lock", what, err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no transaction waited for a lock within 10s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
