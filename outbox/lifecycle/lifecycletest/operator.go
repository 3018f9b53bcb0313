package lifecycletest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/outbox/lifecycle"
)

// runOut waits until a claim of lease taken now has run out on the
// database's clock.
func (f *fixture) runOut(lease time.Duration) {
	time.Sleep(lease + 4*time.Millisecond + 2*f.ClockResolution)
}

var reclaimTests = []test{
	{"TakesBack", func(t *testing.T, tg Target) {
		// A claim that ran out is taken back, its attempt counted: waiting
		// for a retry due at once, or dead at the cap, with claim_expired
		// naming the relay. A live claim stays.
		f := newFixture(tg)
		ids := append(f.enqueue(t, msg("a")), f.enqueue(t, msg("b"))...)
		keep := f.enqueue(t, msg("c"))
		f.claim(t, "t1", 2, time.Millisecond)
		f.claim(t, "t2", 1, time.Hour)
		f.set(t, ids[1], "attempts", 4)
		f.runOut(time.Millisecond)
		got, err := f.Table.Reclaim(ctx, f.DB, 5)
		if err != nil || len(got) != 2 {
			t.Fatalf("reclaim: %+v, %v", got, err)
		}
		byID := map[string]lifecycle.Reclaimed{got[0].ID: got[0], got[1].ID: got[1]}
		if r := byID[ids[0]]; r.State != lifecycle.RetryWait || r.Attempts != 1 || r.Topic != "a" || r.RowID == 0 {
			t.Errorf("reclaimed %+v", r)
		}
		if r := byID[ids[1]]; r.State != lifecycle.Dead || r.Attempts != 5 {
			t.Errorf("reclaimed at the cap %+v", r)
		}
		if r := f.row(t, ids[0]); r.state != lifecycle.RetryWait || r.dueIn > 0 || r.token != "" || r.finished ||
			r.lastError != "claim_expired: the claim of relay-t1 ran out before it marked an outcome" {
			t.Errorf("reclaimed row %+v", r)
		}
		if r := f.row(t, ids[1]); r.state != lifecycle.Dead || !r.finished {
			t.Errorf("reclaimed at the cap: %+v", r)
		}
		if r := f.row(t, keep[0]); r.state != lifecycle.Claimed || r.token != "t2" {
			t.Errorf("a live claim was taken back: %+v", r)
		}
		if again, err := f.Table.Reclaim(ctx, f.DB, 5); err != nil || len(again) != 0 {
			t.Errorf("reclaim again: %+v, %v", again, err)
		}
	}},
	{"FencesRelay", func(t *testing.T, tg Target) {
		// Once its claim was taken back, the first relay's marks change
		// nothing: its extend returns nothing, its done marks nothing, and
		// the message is claimed anew under another token.
		f := newFixture(tg)
		ids, rows := f.claimedFor(t, 1, time.Millisecond)
		f.runOut(time.Millisecond)
		if got, err := f.Table.Reclaim(ctx, f.DB, 5); err != nil || len(got) != 1 {
			t.Fatalf("reclaim: %+v, %v", got, err)
		}
		if held, err := f.Table.Extend(ctx, f.DB, "t1", rows, time.Minute); err != nil || len(held) != 0 {
			t.Errorf("the first relay's extend: %v, %v", held, err)
		}
		if got := f.claim(t, "t2", 10, time.Minute); !slices.Equal(claimedIDs(got), ids) || got[0].Attempts != 1 {
			t.Fatalf("claimed anew: %+v", got)
		}
		if marked, err := f.Table.Done(ctx, f.DB, "t1", rows); err != nil || len(marked) != 0 {
			t.Errorf("the first relay's done: %v, %v", marked, err)
		}
		if _, err := f.Table.Retry(ctx, f.DB, "t1", rows[0], 5, time.Second, "x"); !errors.Is(err, lifecycle.ErrNotClaimed) {
			t.Errorf("the first relay's retry: %v, want ErrNotClaimed", err)
		}
		if r := f.row(t, ids[0]); r.state != lifecycle.Claimed || r.token != "t2" || r.attempts != 1 {
			t.Errorf("after the first relay's marks: %+v", r)
		}
	}},
}

var operatorTests = []test{
	{"SuspendResume", func(t *testing.T, tg Target) {
		// An operator suspends by topic, ordering key or IDs any message
		// scheduled, ready, waiting or claimed (which loses its token),
		// counting no attempt; resume makes them ready and due now, or
		// scheduled when their due time is later.
		f := newFixture(tg)
		a := f.enqueue(t, msg("orders"), msg("orders"))
		b := f.enqueue(t, lifecycle.NewMessage{Topic: "orders", NotBefore: time.Now().Add(time.Hour)})
		c := f.enqueue(t, lifecycle.NewMessage{Topic: "payments", OrderingKey: "acct-1"})
		d := f.enqueue(t, msg("payments"))
		f.claim(t, "t1", 10, time.Minute) // a[0], c[0], d[0]
		f.set(t, d[0], "status", "done", "claim_token", nil, "claim_until", nil, "finished_at", time.Duration(0))

		if _, err := f.Table.Suspend(ctx, f.DB, lifecycle.Selector{}, "x"); !errors.Is(err, lifecycle.ErrNoSelection) {
			t.Errorf("suspend of nothing selected: %v", err)
		}
		got, err := f.Table.Suspend(ctx, f.DB, lifecycle.Selector{Topic: "orders"}, "orders down")
		if err != nil || len(got) != 3 {
			t.Fatalf("suspend -topic orders: %+v, %v", got, err)
		}
		for _, id := range append(slices.Clone(a), b...) {
			if r := f.row(t, id); r.state != lifecycle.Suspended || r.suspendedReason != "orders down" || r.token != "" || r.attempts != 0 {
				t.Errorf("%s suspended: %+v", id, r)
			}
		}
		if marked, err := f.Table.Done(ctx, f.DB, "t1", []int64{f.row(t, a[0]).id}); err != nil || len(marked) != 0 {
			t.Errorf("the relay's done mark of a suspended message: %v, %v", marked, err)
		}
		if got, err := f.Table.Suspend(ctx, f.DB, lifecycle.Selector{OrderingKey: "acct-1"}, "acct"); err != nil || !slices.Equal(changedIDs(got), c) {
			t.Errorf("suspend -key acct-1: %+v, %v", got, err)
		}
		if got, err := f.Table.Suspend(ctx, f.DB, lifecycle.Selector{IDs: d}, "x"); err != nil || len(got) != 0 {
			t.Errorf("suspend of a done message: %+v, %v", got, err)
		}
		if st, err := f.Table.Status(ctx, f.DB, 5); err != nil || !slices.Equal(st.Suspended, []lifecycle.Reason{{Reason: "orders down", Messages: 3}, {Reason: "acct", Messages: 1}}) {
			t.Errorf("suspended by reason: %+v, %v", st, err)
		}

		got, err = f.Table.Resume(ctx, f.DB, lifecycle.Selector{IDs: append(slices.Clone(a), b...)})
		if err != nil || len(got) != 3 {
			t.Fatalf("resume: %+v, %v", got, err)
		}
		if r := f.row(t, a[0]); r.state != lifecycle.Ready || r.dueIn > 0 || r.suspendedReason != "" {
			t.Errorf("resumed %+v, want ready and due", r)
		}
		if r := f.row(t, b[0]); r.state != lifecycle.Scheduled || !f.within(r.dueIn, 59*time.Minute, time.Hour) {
			t.Errorf("resumed %+v, want scheduled in an hour", r)
		}
		if got, err := f.Table.Resume(ctx, f.DB, lifecycle.Selector{All: true}); err != nil || len(got) != 1 || got[0].ID != c[0] || got[0].State != lifecycle.Ready {
			t.Errorf("resume all: %+v, %v", got, err)
		}
	}},
	{"Schedule", func(t *testing.T, tg Target) {
		// Scheduled, ready and waiting messages fall due at a time, or
		// after a duration from the database's clock; claimed, suspended
		// and finished ones are left alone.
		f := newFixture(tg)
		a := f.enqueue(t, msg("a"))
		b := f.enqueue(t, msg("b"))
		c := f.enqueue(t, msg("c"))
		e := f.enqueue(t, msg("e"))
		f.claim(t, "t", 1, time.Minute) // a
		f.set(t, e[0], "status", "suspended")
		got, err := f.Table.Schedule(ctx, f.DB, slices.Concat(a, b, c, e), lifecycle.When{In: time.Hour})
		if err != nil || !sameIDs(changedIDs(got), slices.Concat(b, c)) || got[0].State != lifecycle.Scheduled {
			t.Fatalf("schedule: %+v, %v", got, err)
		}
		if r := f.row(t, b[0]); r.state != lifecycle.Scheduled || !f.within(r.dueIn, 59*time.Minute, time.Hour) {
			t.Errorf("scheduled %+v", r)
		}
		if r := f.row(t, a[0]); r.state != lifecycle.Claimed {
			t.Errorf("a claimed message was scheduled: %+v", r)
		}
		at := time.Now().Add(-time.Minute)
		got, err = f.Table.Schedule(ctx, f.DB, c, lifecycle.When{At: at})
		if err != nil || len(got) != 1 || got[0].State != lifecycle.Ready {
			t.Errorf("schedule in the past: %+v, %v, want ready", got, err)
		}
		if r := f.row(t, c[0]); !r.dueAt.Equal(at.Truncate(time.Microsecond)) || r.dueIn > -59*time.Second {
			t.Errorf("due at %v (in %v), want %v", r.dueAt, r.dueIn, at)
		}
		if _, err := f.Table.Schedule(ctx, f.DB, nil, lifecycle.When{}); !errors.Is(err, lifecycle.ErrNoSelection) {
			t.Errorf("schedule of no IDs: %v", err)
		}
	}},
	{"Cancel", func(t *testing.T, tg Target) {
		// Any message not finished is canceled, with its reason; a claimed
		// one loses its token, so that its relay's marks are refused;
		// finished ones are left alone.
		f := newFixture(tg)
		claimed := f.enqueue(t, msg("a"))
		rows := f.claim(t, "t", 1, time.Minute)
		ready := f.enqueue(t, msg("b"))
		suspended := f.enqueue(t, msg("s"))
		done := f.enqueue(t, msg("c"))
		f.set(t, suspended[0], "status", "suspended")
		f.set(t, done[0], "status", "done", "finished_at", time.Duration(0))
		got, err := f.Table.Cancel(ctx, f.DB, slices.Concat(claimed, ready, suspended, done, []string{"key-9/1"}), "by test")
		if err != nil || !sameIDs(changedIDs(got), slices.Concat(claimed, ready, suspended)) {
			t.Fatalf("cancel: %+v, %v", got, err)
		}
		for _, id := range slices.Concat(claimed, ready, suspended) {
			if r := f.row(t, id); r.state != lifecycle.Canceled || r.lastError != "canceled: by test" || !r.finished || r.token != "" {
				t.Errorf("canceled %+v", r)
			}
		}
		if marked, err := f.Table.Done(ctx, f.DB, "t", []int64{rows[0].RowID}); err != nil || len(marked) != 0 {
			t.Errorf("the relay's done mark of a canceled message: %v, %v", marked, err)
		}
		if r := f.row(t, done[0]); r.state != lifecycle.Done || r.lastError != "" {
			t.Errorf("a done message was canceled: %+v", r)
		}
		if _, err := f.Table.Cancel(ctx, f.DB, []string{"nope"}, "x"); !errors.Is(err, lifecycle.ErrInvalidID) {
			t.Errorf("cancel of an invalid ID: %v", err)
		}
		if got, err := f.Table.Cancel(ctx, f.DB, nil, "x"); err != nil || got != nil {
			t.Errorf("cancel of no IDs: %v, %v", got, err)
		}
	}},
	{"Requeue", func(t *testing.T, tg Target) {
		// Finished messages of the states asked are ready again, due now,
		// their attempts reset, the requeue recorded; their last error
		// stays.
		f := newFixture(tg)
		dead := f.enqueue(t, msg("a"))
		done := f.enqueue(t, msg("a"))
		ready := f.enqueue(t, msg("a"))
		f.set(t, dead[0], "status", "dead", "attempts", 25, "last_error", "publish_failed: x", "finished_at", -time.Hour, "due_at", -2*time.Hour)
		f.set(t, done[0], "status", "done", "attempts", 1, "finished_at", time.Duration(0))

		got, err := f.Table.Requeue(ctx, f.DB, lifecycle.Selector{Topic: "a"}, []lifecycle.State{lifecycle.Dead}, "ops")
		if err != nil || !slices.Equal(changedIDs(got), dead) || got[0].State != lifecycle.Ready {
			t.Fatalf("requeue dead: %+v, %v", got, err)
		}
		if r := f.row(t, dead[0]); r.state != lifecycle.Ready || r.attempts != 0 || r.finished || r.requeues != 1 || r.requeuedBy != "ops" ||
			r.lastError != "publish_failed: x" || r.dueIn > 0 || r.dueIn < -time.Minute {
			t.Errorf("requeued %+v", r)
		}
		if _, err := f.Table.Requeue(ctx, f.DB, lifecycle.Selector{All: true}, []lifecycle.State{lifecycle.Ready}, "ops"); err == nil {
			t.Error("requeue of ready messages: no error")
		}
		if _, err := f.Table.Requeue(ctx, f.DB, lifecycle.Selector{}, nil, "ops"); !errors.Is(err, lifecycle.ErrNoSelection) {
			t.Errorf("requeue of nothing selected: %v", err)
		}
		got, err = f.Table.Requeue(ctx, f.DB, lifecycle.Selector{IDs: slices.Concat(done, ready)}, nil, "ops2")
		if err != nil || !slices.Equal(changedIDs(got), done) {
			t.Errorf("requeue by IDs: %+v, %v", got, err)
		}
		if st, err := f.Table.Status(ctx, f.DB, 5); err != nil || st.Requeued != 2 || st.Counts[lifecycle.Ready] != 3 {
			t.Errorf("status after the requeues: %+v, %v", st, err)
		}
	}},
	{"Purge", func(t *testing.T, tg Target) {
		// Finished messages past the age are deleted, the oldest first, a
		// limit at a time; those not finished never.
		f := newFixture(tg)
		var old []string
		for i, st := range []string{"done", "dead", "canceled"} {
			id := f.enqueue(t, msg("t"))[0]
			f.set(t, id, "status", st, "finished_at", -time.Duration(3-i)*time.Hour)
			old = append(old, id)
		}
		young := f.enqueue(t, msg("t"))[0]
		f.set(t, young, "status", "done", "finished_at", time.Duration(0))
		open := f.enqueue(t, msg("t"))[0]
		f.set(t, open, "enqueued_at", -24*time.Hour, "due_at", -24*time.Hour)

		all := lifecycle.Selector{All: true}
		got, err := f.Table.Purge(ctx, f.DB, lifecycle.PurgeFilter{Selector: all, Older: time.Hour, Limit: 2})
		if err != nil || !sameIDs(changedIDs(got), old[:2]) {
			t.Fatalf("purge: %+v, %v; want %v", got, err, old[:2])
		}
		got, err = f.Table.Purge(ctx, f.DB, lifecycle.PurgeFilter{Selector: all, States: []lifecycle.State{lifecycle.Done}, Older: time.Hour, Limit: 10})
		if err != nil || len(got) != 0 {
			t.Errorf("purge done: %+v, %v; want none (the young one is not old enough)", got, err)
		}
		got, err = f.Table.Purge(ctx, f.DB, lifecycle.PurgeFilter{Selector: all, States: []lifecycle.State{lifecycle.Canceled}, Older: time.Hour, Limit: 10})
		if err != nil || !slices.Equal(changedIDs(got), old[2:]) {
			t.Errorf("purge canceled: %+v, %v", got, err)
		}
		got, err = f.Table.Purge(ctx, f.DB, lifecycle.PurgeFilter{Selector: lifecycle.Selector{IDs: []string{young, open}}, Limit: 10})
		if err != nil || !slices.Equal(changedIDs(got), []string{young}) {
			t.Errorf("purge by IDs: %+v, %v", got, err)
		}
		for _, id := range append(slices.Clone(old), young) {
			if _, ok := f.find(t, id); ok {
				t.Errorf("%s purged, still in the table", id)
			}
		}
		if st, err := f.Table.Status(ctx, f.DB, 5); err != nil || st.Total != 1 || st.Counts[lifecycle.Ready] != 1 {
			t.Errorf("left %+v, %v; want the ready message alone", st, err)
		}
		if _, err := f.Table.Purge(ctx, f.DB, lifecycle.PurgeFilter{Selector: all, States: []lifecycle.State{lifecycle.Ready}, Limit: 1}); err == nil {
			t.Error("purge of ready messages: no error")
		}
		if _, err := f.Table.Purge(ctx, f.DB, lifecycle.PurgeFilter{Selector: all}); err == nil {
			t.Error("purge without a limit: no error")
		}
	}},
}
