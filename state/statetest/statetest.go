// Package statetest is the conformance suite of package state on a
// database engine: the Store's operations, its events in the outbox, its
// history, its part in a caller's transaction and its behaviour under
// concurrent transitions, checked for linearizability with porcupine.
//
// An engine's tests call Run from an ordinary test, handing it a function
// that returns the engine's Target:
//
//	func TestConformance(t *testing.T) {
//		pool := ... // a database of its own, migrated (pgstore.Migrate)
//		store := pgstore.New(pool)
//		t.Cleanup(func() { store.Close() })
//		runner := idempotency.NewRunner(store, idempotency.WithTransaction(true))
//		statetest.Run(t, func(t *testing.T) statetest.Target {
//			return statetest.Target{
//				NewStore: func(opts ...state.Option) *state.Store { return state.New(pool, opts...) },
//				Runner:   runner,
//			}
//		})
//	}
//
// Each check is a named subtest, so that one can be run alone:
//
//	go test -run 'TestConformance/Transition/ConflictOrder' ./state
//
// Run calls newTarget once per subtest, with that subtest's *testing.T,
// and the subtests run in parallel. The targets may share one database:
// each subtest works in a scope of its own (a random one), so subtests
// never see each other's records or events. The whole suite takes a few
// seconds.
package statetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strconv"
	"testing"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/state"
)

// Target is what the suite needs of an engine.
type Target struct {
	// NewStore returns a Store of the database under test with opts (and
	// the engine's own options, such as its dialect), whose tables exist,
	// with the default table names.
	NewStore func(opts ...state.Option) *state.Store
	// Runner is a transactional Runner (idempotency.WithTransaction(true))
	// over the engine's TxStore on the same database, whose calls'
	// transactions the Store's methods run in, and whose outbox is the
	// Store's.
	Runner *idempotency.Runner
}

// Run runs the conformance suite against the targets newTarget returns.
func Run(t *testing.T, newTarget func(t *testing.T) Target) {
	t.Helper()
	groups := []struct {
		name  string
		tests []test
	}{
		{"Create", createTests},
		{"Get", getTests},
		{"Transition", transitionTests},
		{"Grammar", grammarTests},
		{"Events", eventTests},
		{"Transaction", transactionTests},
		{"Concurrency", concurrencyTests},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			for _, tc := range g.tests {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
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

// ctxT is the context's type, short for the functions the subtests pass.
type ctxT = context.Context

// scope returns a scope of the subtest's own.
func scope(t *testing.T) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return "statetest-" + hex.EncodeToString(b[:])
}

// ref returns a record of the subtest's own scope.
func ref(t *testing.T, id string) state.Ref {
	return state.Ref{Scope: scope(t), Machine: "statetest.payment", ID: id}
}

// create creates ref in st with data, failing t on an error.
func create(t *testing.T, s *state.Store, r state.Ref, st string, data string) state.Record {
	t.Helper()
	var raw []byte
	if data != "" {
		raw = []byte(data)
	}
	rec, err := s.Create(ctx, r, st, raw)
	if err != nil {
		t.Fatalf("Create %s: %v", st, err)
	}
	return rec
}

// move makes the transition from → to at version, failing t on an error.
func move(t *testing.T, s *state.Store, r state.Ref, from, to string, version int64) state.Record {
	t.Helper()
	rec, err := s.Transition(ctx, r, state.Change{From: from, To: to, ExpectedVersion: version})
	if err != nil {
		t.Fatalf("Transition %s → %s at %d: %v", from, to, version, err)
	}
	return rec
}

// get reads r, failing t on an error.
func get(t *testing.T, s *state.Store, r state.Ref) state.Record {
	t.Helper()
	rec, err := s.Get(ctx, r)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	return rec
}

// sameRecord fails t unless got is want: the same ref, state, version,
// data (byte for byte) and times.
func sameRecord(t *testing.T, what string, got, want state.Record) {
	t.Helper()
	if got.Ref != want.Ref || got.State != want.State || got.Version != want.Version ||
		!bytes.Equal(got.Data, want.Data) || !got.CreatedAt.Equal(want.CreatedAt) || !got.UpdatedAt.Equal(want.UpdatedAt) {
		t.Errorf("%s: got %s, want %s", what, describe(got), describe(want))
	}
}

func describe(r state.Record) string {
	return r.Machine + "/" + r.ID + " " + r.State + " v" + strconv.FormatInt(r.Version, 10) + " " + string(r.Data) +
		" created " + r.CreatedAt.String() + " updated " + r.UpdatedAt.String()
}

// wantError fails t unless err is a T (an error type of package state)
// with code, wrapping sentinel and, when permanent, idempotency.ErrPermanent.
func wantError[T interface {
	error
	Code() string
}](t *testing.T, what string, err error, code string, sentinel error, permanent bool) T {
	t.Helper()
	var target T
	switch {
	case !errors.As(err, &target):
		t.Fatalf("%s: error %v (%T), want a %T", what, err, err, target)
	case target.Code() != code:
		t.Errorf("%s: code %q, want %q", what, target.Code(), code)
	case !errors.Is(err, sentinel):
		t.Errorf("%s: %v does not wrap %v", what, err, sentinel)
	case errors.Is(err, idempotency.ErrPermanent) != permanent:
		t.Errorf("%s: %v wraps idempotency.ErrPermanent: %v, want %v", what, err, !permanent, permanent)
	}
	return target
}

// written returns how many history rows and outbox events r has.
func written(t *testing.T, s *state.Store, r state.Ref) (history, events int) {
	t.Helper()
	h, err := s.History(ctx, r, 0, 0)
	if err != nil && !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("History: %v", err)
	}
	d, err := s.Deliveries(ctx, r)
	if err != nil {
		t.Fatalf("Deliveries: %v", err)
	}
	return len(h), len(d)
}

// wantWritten fails t unless r has history rows and events as many as n.
func wantWritten(t *testing.T, what string, s *state.Store, r state.Ref, n int) {
	t.Helper()
	if h, e := written(t, s, r); h != n || e != n {
		t.Errorf("%s: %d history rows and %d events, want %d of each", what, h, e, n)
	}
}
