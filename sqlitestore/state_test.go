package sqlitestore_test

import (
	"context"
	"testing"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/state"
	"github.com/go-idempotency/idempotency/state/statetest"
)

// TestStateConformance runs the state records' conformance suite on one
// file: the Store's States, and a transactional Runner over the Store.
func TestStateConformance(t *testing.T) {
	s := open(t, newPath(t))
	runner := idempotency.NewRunner(s, idempotency.WithTransaction(true))
	statetest.Run(t, func(t *testing.T) statetest.Target {
		return statetest.Target{
			NewStore: func(opts ...state.Option) *state.Store { return s.States(opts...) },
			Runner:   runner,
		}
	})
}

// TestStateTransitionAllOrNothingInRoute: on SQLite a transition is three
// statements; inside a route's transaction they run in a savepoint, so a
// transition whose event cannot be written leaves the record as it was,
// even when the handler ignores the error and its transaction commits.
func TestStateTransitionAllOrNothingInRoute(t *testing.T) {
	s := open(t, newPath(t))
	ctx := context.Background()
	payments := s.States()
	ref := state.Ref{Scope: "acme", Machine: "payment", ID: "pay_1"}
	if _, err := payments.Create(ctx, ref, "authorized", nil); err != nil {
		t.Fatal(err)
	}
	// A message already at the event's place: the event's insert fails.
	if _, err := s.DB().ExecContext(ctx, `INSERT INTO idempotency_outbox
		(storage_key, seq, topic, payload, headers, ordering_key, status, enqueued_at, due_at)
		VALUES (?, 2, 'taken', x'', '{}', 'k', 'done', 0, 0)`, state.EventKey(ref)); err != nil {
		t.Fatal(err)
	}
	runner := idempotency.NewRunner(s, idempotency.WithTransaction(true))
	var moveErr error
	_, err := idempotency.Do(ctx, runner, idempotency.Call{Name: "capture", Key: "k1"}, func(ctx context.Context) (string, error) {
		_, moveErr = payments.Transition(ctx, ref, state.Change{From: "authorized", To: "captured", ExpectedVersion: 1})
		return "answered anyway", nil // the handler's transaction commits
	})
	if err != nil {
		t.Fatal(err)
	}
	if moveErr == nil {
		t.Fatal("the transition succeeded with its event's place taken")
	}
	rec, err := payments.Get(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != "authorized" || rec.Version != 1 {
		t.Errorf("the record is %s at version %d after a transition that failed, want authorized at 1", rec.State, rec.Version)
	}
	if h, err := payments.History(ctx, ref, 0, 0); err != nil || len(h) != 0 {
		t.Errorf("history %v, %v; want none", h, err)
	}
}
