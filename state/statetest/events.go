package statetest

import (
	"errors"
	"maps"
	"testing"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/state"
)

var eventTests = []test{
	{"VersionOrder", func(t *testing.T, tg Target) {
		// Each transition has one event in the outbox and one history
		// row: in version order, named EventID(ref, version), with the
		// record's topic and ordering key, the history's time the
		// transition's.
		s := tg.NewStore()
		r := ref(t, "pay_1")
		create(t, s, r, "a", "")
		steps := []state.Change{{From: "a", To: "b"}, {From: "b", To: "c"}, {From: "c", To: "c"}, {From: "c", To: "a"}}
		var made []state.Record
		for i, c := range steps {
			made = append(made, move(t, s, r, c.From, c.To, int64(i+1)))
		}
		ds, err := s.Deliveries(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		hs, err := s.History(ctx, r, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) != len(steps) || len(hs) != len(steps) {
			t.Fatalf("%d events and %d history rows for %d transitions", len(ds), len(hs), len(steps))
		}
		for i, c := range steps {
			v := int64(i + 2)
			d, h := ds[i], hs[i]
			for what, ev := range map[string]state.Event{"event": d.Event, "history": h} {
				if ev.ID != state.EventID(r, v) || ev.Ref != r || ev.From != c.From || ev.To != c.To || ev.Version != v {
					t.Errorf("%s %d: %+v, want %s → %s at version %d, ID %s", what, i, ev, c.From, c.To, v, state.EventID(r, v))
				}
			}
			if d.Topic != s.Topic(r.Machine) || d.OrderingKey != state.OrderingKey(r) || d.State == "" {
				t.Errorf("event %d: topic %q, ordering key %q, state %q", i, d.Topic, d.OrderingKey, d.State)
			}
			if !h.At.Equal(made[i].UpdatedAt) {
				t.Errorf("history %d at %v, the transition's record updated at %v", i, h.At, made[i].UpdatedAt)
			}
		}
		page, err := s.History(ctx, r, 2, 2)
		if err != nil || len(page) != 2 || page[0].Version != 3 || page[1].Version != 4 {
			t.Errorf("History after 2, limit 2: %+v, %v; want versions 3 and 4", page, err)
		}
	}},
	{"TopicPrefix", func(t *testing.T, tg Target) {
		s := tg.NewStore(state.WithTopicPrefix("billing.events"))
		r := ref(t, "pay_1")
		create(t, s, r, "a", "")
		move(t, s, r, "a", "b", 1)
		ds, err := s.Deliveries(ctx, r)
		if err != nil || len(ds) != 1 || ds[0].Topic != "billing.events."+r.Machine {
			t.Fatalf("deliveries %+v, %v; want one of topic billing.events.%s", ds, err, r.Machine)
		}
	}},
	{"Cause", func(t *testing.T, tg Target) {
		// In a call's context, the event and its history row name the
		// call's key, storage key and epoch, and carry the W3C trace
		// context (also the message's headers); other propagation
		// headers are dropped. Outside one, the cause is empty.
		const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		trace := func(ctx ctxT) map[string]string {
			return map[string]string{"traceparent": tp, "TraceState": "vendor=x", "baggage": "user=alice"}
		}
		s := tg.NewStore(state.WithTraceContext(trace))
		r := ref(t, "pay_1")
		create(t, s, r, "a", "")
		var info idempotency.Info
		call := idempotency.Call{Name: "statetest.cause", Key: "key-" + r.Scope, Scope: r.Scope}
		res, err := idempotency.Do(ctx, tg.Runner, call, func(ctx ctxT) (string, error) {
			info, _ = idempotency.FromContext(ctx)
			_, err := s.Transition(ctx, r, state.Change{From: "a", To: "b", ExpectedVersion: 1})
			return "", err
		})
		if err != nil || res.Outcome != idempotency.OutcomeCommitted {
			t.Fatalf("Do: %v, %v; want committed", res.Outcome, err)
		}
		want := state.Cause{Key: call.Key, StorageKey: info.StorageKey, Epoch: 1,
			Trace: map[string]string{"traceparent": tp, "tracestate": "vendor=x"}}
		ds, err := s.Deliveries(ctx, r)
		if err != nil || len(ds) != 1 {
			t.Fatalf("deliveries %+v, %v", ds, err)
		}
		hs, err := s.History(ctx, r, 0, 0)
		if err != nil || len(hs) != 1 {
			t.Fatalf("history %+v, %v", hs, err)
		}
		for what, got := range map[string]state.Cause{"event": ds[0].Cause, "history": hs[0].Cause} {
			if !sameCause(got, want) {
				t.Errorf("%s's cause %+v, want %+v", what, got, want)
			}
		}
		if !maps.Equal(ds[0].Headers, want.Trace) {
			t.Errorf("message headers %v, want %v", ds[0].Headers, want.Trace)
		}

		plain := tg.NewStore()
		move(t, plain, r, "b", "c", 2)
		hs, err = plain.History(ctx, r, 2, 0)
		if err != nil || len(hs) != 1 || !sameCause(hs[0].Cause, state.Cause{}) {
			t.Errorf("cause outside a call: %+v, %v; want empty", hs, err)
		}
	}},
}

func sameCause(a, b state.Cause) bool {
	return a.Key == b.Key && a.StorageKey == b.StorageKey && a.Epoch == b.Epoch && maps.Equal(a.Trace, b.Trace)
}

var transactionTests = []test{
	{"Commit", func(t *testing.T, tg Target) {
		// In a transactional call, the transition is the call's: the
		// call reads its own write, and after the commit everyone does.
		s := tg.NewStore()
		r := ref(t, "pay_1")
		create(t, s, r, "authorized", "")
		res, err := idempotency.Do(ctx, tg.Runner, idempotency.Call{Name: "statetest.commit", Key: "k-" + r.Scope}, func(ctx ctxT) (int64, error) {
			rec, err := s.Transition(ctx, r, state.Change{From: "authorized", To: "captured", ExpectedVersion: 1})
			if err != nil {
				return 0, err
			}
			seen, err := s.Get(ctx, r)
			if err != nil || seen.Version != rec.Version {
				return 0, errors.New("the call does not read its own transition")
			}
			return rec.Version, nil
		})
		if err != nil || res.Outcome != idempotency.OutcomeCommitted || res.Value != 2 {
			t.Fatalf("Do: %v %v, %v", res.Outcome, res.Value, err)
		}
		if rec := get(t, s, r); rec.Version != 2 || rec.State != "captured" {
			t.Errorf("after the commit: %s", describe(rec))
		}
		wantWritten(t, "after the commit", s, r, 1)
	}},
	{"Rollback", func(t *testing.T, tg Target) {
		// Transitions whose call fails roll back with it: no version, no
		// event, no history.
		s := tg.NewStore()
		r := ref(t, "pay_1")
		before := create(t, s, r, "authorized", "")
		fail := errors.New("the handler failed after its transitions")
		res, err := idempotency.Do(ctx, tg.Runner, idempotency.Call{Name: "statetest.rollback", Key: "k-" + r.Scope}, func(ctx ctxT) (string, error) {
			if _, err := s.Transition(ctx, r, state.Change{From: "authorized", To: "captured", ExpectedVersion: 1}); err != nil {
				return "", err
			}
			if _, err := s.Transition(ctx, r, state.Change{From: "captured", To: "settled", ExpectedVersion: 2}); err != nil {
				return "", err
			}
			return "", fail
		})
		if !errors.Is(err, fail) || res.Outcome != idempotency.OutcomeReleased {
			t.Fatalf("Do: %v, %v; want released with the function's error", res.Outcome, err)
		}
		sameRecord(t, "after the rollback", get(t, s, r), before)
		wantWritten(t, "after the rollback", s, r, 0)
	}},
	{"Refused", func(t *testing.T, tg Target) {
		// A call that returns a conflict is refused for good
		// (ErrPermanent), and its error is the conflict.
		s := tg.NewStore()
		r := ref(t, "pay_1")
		create(t, s, r, "authorized", "")
		move(t, s, r, "authorized", "canceled", 1)
		res, err := idempotency.Do(ctx, tg.Runner, idempotency.Call{Name: "statetest.refused", Key: "k-" + r.Scope}, func(ctx ctxT) (state.Record, error) {
			return s.Transition(ctx, r, state.Change{From: "authorized", To: "captured", ExpectedVersion: 1})
		})
		if res.Outcome != idempotency.OutcomeRefused || res.Outcome.Class() != idempotency.ClassPermanent {
			t.Errorf("Do: outcome %v, want refused (permanent)", res.Outcome)
		}
		if e := wantError[*state.ConflictError](t, "Do's error", err, state.CodeConflict, state.ErrConflict, true); e.Current.State != "canceled" {
			t.Errorf("the conflict carries %s", describe(e.Current))
		}
		wantWritten(t, "after the refused call", s, r, 1)
	}},
	{"Race", func(t *testing.T, tg Target) {
		// A transition outside the call, racing from the version the
		// call is moving, waits for the call's transaction and is then
		// refused, with the call's record.
		s := tg.NewStore()
		r := ref(t, "pay_1")
		create(t, s, r, "authorized", "")
		moved, commit := make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := idempotency.Do(ctx, tg.Runner, idempotency.Call{Name: "statetest.race", Key: "k-" + r.Scope}, func(ctx ctxT) (string, error) {
				_, err := s.Transition(ctx, r, state.Change{From: "authorized", To: "captured", ExpectedVersion: 1})
				close(moved)
				<-commit
				return "", err
			})
			done <- err
		}()
		<-moved
		if rec := get(t, s, r); rec.Version != 1 {
			t.Errorf("an uncommitted transition is visible: %s", describe(rec))
		}
		raced := make(chan error, 1)
		go func() {
			_, err := s.Transition(ctx, r, state.Change{From: "authorized", To: "canceled", ExpectedVersion: 1})
			raced <- err
		}()
		close(commit)
		if err := <-done; err != nil {
			t.Fatalf("the call: %v", err)
		}
		e := wantError[*state.ConflictError](t, "the racing transition", <-raced, state.CodeConflict, state.ErrConflict, true)
		if e.Reason != state.ReasonVersion || e.Current.State != "captured" || e.Current.Version != 2 {
			t.Errorf("the racing transition's conflict: %s, %s", e.Reason, describe(e.Current))
		}
		wantWritten(t, "after the race", s, r, 1)
	}},
}
