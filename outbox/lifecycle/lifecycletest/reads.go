package lifecycletest

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/outbox/lifecycle"
)

var readTests = []test{
	{"RelayState", func(t *testing.T, tg Target) {
		// The relay's state: how long the earliest due message has been
		// due, how long until the next one not due yet falls due, and
		// until the next claim runs out; zero on an empty table.
		f := newFixture(tg)
		if st, err := f.Table.RelayState(ctx, f.DB); err != nil || st != (lifecycle.RelayState{}) {
			t.Errorf("relay state of an empty table: %+v, %v", st, err)
		}
		a := f.enqueue(t, msg("a"))
		f.set(t, a[0], "due_at", -90*time.Second)
		f.enqueue(t, lifecycle.NewMessage{Topic: "b", NotBefore: time.Now().Add(time.Minute)})
		f.enqueue(t, msg("c"))
		f.claim(t, "t", 1, 30*time.Second) // a, the earliest due
		st, err := f.Table.RelayState(ctx, f.DB)
		if err != nil || !f.within(st.Lag, 0, 10*time.Second) || !f.within(st.NextDue, 55*time.Second, time.Minute) ||
			!f.within(st.NextExpiry, 25*time.Second, 30*time.Second) {
			t.Errorf("relay state %+v, %v: want c's lag, b's due in a minute, a's claim in 30s", st, err)
		}
		f.set(t, a[0], "status", "retry_wait", "claim_token", nil, "claim_until", nil)
		if st, err := f.Table.RelayState(ctx, f.DB); err != nil || !f.within(st.Lag, 90*time.Second, 100*time.Second) || st.NextExpiry != 0 {
			t.Errorf("relay state %+v, %v: want a's lag of 90s, no claim", st, err)
		}
	}},
	{"Status", func(t *testing.T, tg Target) {
		// idemctl's status: the count of each state (every state, 0 when
		// none), the due ones, the earliest due message, the last errors
		// grouped by text with each message's own ID as <id>, the claims
		// by relay and those run out, the suspended by reason.
		f := newFixture(tg)
		a := f.enqueue(t, msg("a"))
		f.set(t, a[0], "due_at", -90*time.Second)
		var dead []string
		for range 3 {
			id := f.enqueue(t, msg("b"))[0]
			f.set(t, id, "status", "dead", "last_error", "refused: "+id+" bad", "finished_at", time.Duration(0))
			dead = append(dead, id)
		}
		other := f.enqueue(t, msg("b"))[0]
		f.set(t, other, "status", "dead", "last_error", "publish_failed: nak", "finished_at", time.Duration(0))
		c := f.enqueue(t, lifecycle.NewMessage{Topic: "c", NotBefore: time.Now().Add(time.Minute)})
		w := f.enqueue(t, msg("w"))
		f.set(t, w[0], "status", "retry_wait", "last_error", "publish_failed: timeout", "due_at", time.Hour, "attempts", 2)
		s := f.enqueue(t, msg("s"))
		f.set(t, s[0], "status", "suspended", "suspended_reason", "budget exhausted")
		f.enqueue(t, msg("r1"))
		f.enqueue(t, msg("r2"))
		f.claim(t, "x", 1, time.Hour)           // a, the earliest due
		f.claim(t, "y", 1, time.Millisecond)    // r1
		f.claim(t, "z", 1, time.Hour)           // r2
		f.set(t, a[0], "claimed_by", "relay-z") // two of z's
		f.runOut(time.Millisecond)

		st, err := f.Table.Status(ctx, f.DB, 1)
		if err != nil {
			t.Fatal(err)
		}
		want := map[lifecycle.State]int64{lifecycle.Scheduled: 1, lifecycle.Ready: 0, lifecycle.Claimed: 3, lifecycle.RetryWait: 1,
			lifecycle.Suspended: 1, lifecycle.Done: 0, lifecycle.Dead: 4, lifecycle.Canceled: 0}
		if st.Total != 10 || !maps.Equal(st.Counts, want) || st.Due[lifecycle.Scheduled] != 0 || st.Due[lifecycle.RetryWait] != 0 || st.RanOut != 1 || st.Requeued != 0 {
			t.Errorf("status %+v", st)
		}
		if time.Since(st.Now) > time.Minute || time.Until(st.Now) > time.Second {
			t.Errorf("status at %v", st.Now)
		}
		if st.Oldest != nil {
			t.Errorf("oldest %+v, want none due", st.Oldest)
		}
		if g := st.Errors[lifecycle.Dead]; g.Groups != 2 || g.Messages != 4 || len(g.Shown) != 1 ||
			g.Shown[0] != (lifecycle.ErrorGroup{Error: "publish_failed: nak", Messages: 1, LatestID: other}) {
			t.Errorf("dead errors %+v", g)
		}
		if g := st.Errors[lifecycle.RetryWait]; g.Groups != 1 || g.Shown[0].Error != "publish_failed: timeout" || g.Shown[0].LatestID != w[0] {
			t.Errorf("waiting errors %+v", g)
		}
		if want := []lifecycle.RelayClaims{{Relay: "relay-y", Claimed: 1, RanOut: 1}, {Relay: "relay-z", Claimed: 2}}; !slices.Equal(st.Relays, want) {
			t.Errorf("relays %+v, want %+v", st.Relays, want)
		}
		if want := []lifecycle.Reason{{Reason: "budget exhausted", Messages: 1}}; !slices.Equal(st.Suspended, want) {
			t.Errorf("suspended %+v", st.Suspended)
		}
		st, err = f.Table.Status(ctx, f.DB, 5)
		if g := st.Errors[lifecycle.Dead]; err != nil || len(g.Shown) != 2 || g.Shown[1] != (lifecycle.ErrorGroup{Error: "refused: <id> bad", Messages: 3, LatestID: dead[2]}) {
			t.Errorf("dead errors of 5 groups: %+v, %v", g, err)
		}
		// Once due, the scheduled message is the oldest due.
		f.set(t, c[0], "due_at", -time.Minute)
		st, err = f.Table.Status(ctx, f.DB, 5)
		if err != nil || st.Oldest == nil || st.Oldest.ID != c[0] || st.Oldest.State != lifecycle.Scheduled || st.Oldest.Topic != "c" ||
			st.Oldest.Attempts != 0 || st.Oldest.EnqueuedAt.IsZero() || !f.within(st.Now.Sub(st.Oldest.DueAt), time.Minute, time.Minute+10*time.Second) ||
			st.Due[lifecycle.Scheduled] != 1 {
			t.Errorf("oldest %+v, due %v, %v", st.Oldest, st.Due, err)
		}
	}},
	{"Lookup", func(t *testing.T, tg Target) {
		// Lookup reads the named messages that are in the table, with
		// their states and the relay that claimed them last; an ID that
		// is not one is refused.
		f := newFixture(tg)
		a := f.enqueue(t, msg("a"))
		c := f.enqueue(t, lifecycle.NewMessage{Topic: "c", NotBefore: time.Now().Add(time.Minute)})
		got := f.claim(t, "t", 1, time.Minute)
		found, err := f.Table.Lookup(ctx, f.DB, []string{a[0], c[0], "key-9/1"})
		if err != nil || len(found) != 2 {
			t.Fatalf("lookup %+v, %v", found, err)
		}
		if fa := found[a[0]]; fa.State != lifecycle.Claimed || fa.ClaimedBy != "relay-t" || fa.RowID != got[0].RowID || fa.ID != a[0] {
			t.Errorf("found %+v", fa)
		}
		if fc := found[c[0]]; fc.State != lifecycle.Scheduled || fc.ClaimedBy != "" {
			t.Errorf("found %+v", fc)
		}
		if _, err := f.Table.Lookup(ctx, f.DB, []string{"nope"}); !errors.Is(err, lifecycle.ErrInvalidID) {
			t.Errorf("lookup of an invalid ID: %v", err)
		}
	}},
	{"LookupLocks", func(t *testing.T, tg Target) {
		// The rows a transaction looked up stay as read until it ends: an
		// edge of another transaction on them waits, and then acts on
		// what the first left.
		needConcurrentWriters(t, tg, "an edge waiting on the rows another transaction's Lookup locked")
		f := newFixture(tg)
		a := f.enqueue(t, msg("a"))
		looked, suspend := make(chan error, 1), make(chan struct{})
		release := sync.OnceFunc(func() { close(suspend) })
		t.Cleanup(release) // a test that fails first leaves no transaction open
		first := make(chan error, 1)
		go func() {
			first <- lifecycle.InTx(ctx, f.DB, func(db lifecycle.DB) error {
				found, err := f.Table.Lookup(ctx, db, a)
				if err == nil && found[a[0]].State != lifecycle.Ready {
					err = errors.New("not ready")
				}
				looked <- err
				<-suspend
				if err == nil {
					_, err = f.Table.Suspend(ctx, db, lifecycle.Selector{IDs: a}, "held")
				}
				return err
			})
		}()
		if err := <-looked; err != nil {
			t.Fatal(err)
		}
		second := make(chan error, 1)
		go func() {
			_, err := f.Table.Cancel(ctx, f.DB, a, "by test")
			second <- err
		}()
		awaitLockWait(t, tg, "the cancel of a looked-up row", second)
		release()
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		if err := <-second; err != nil {
			t.Fatal(err)
		}
		if r := f.row(t, a[0]); r.state != lifecycle.Canceled || r.suspendedReason != "held" {
			t.Errorf("%+v: want suspended first, then canceled", r)
		}
	}},
	{"States", func(t *testing.T, tg Target) {
		// States reads the state of each row still in the table.
		f := newFixture(tg)
		ids, rows := f.claimed(t, 2)
		if _, err := f.Table.Cancel(ctx, f.DB, ids[1:], "x"); err != nil {
			t.Fatal(err)
		}
		states, err := f.Table.States(ctx, f.DB, append(slices.Clone(rows), rows[1]+1000))
		if err != nil || len(states) != 2 || states[rows[0]] != lifecycle.Claimed || states[rows[1]] != lifecycle.Canceled {
			t.Errorf("states %v, %v", states, err)
		}
		if states, err := f.Table.States(ctx, f.DB, nil); err != nil || len(states) != 0 {
			t.Errorf("states of no rows: %v, %v", states, err)
		}
	}},
	{"List", func(t *testing.T, tg Target) {
		// List reads the messages in a state, of a topic or all, the
		// earliest to finish first, at most a limit.
		f := newFixture(tg)
		var dead []string
		for i, topic := range []string{"a", "b", "a"} {
			id := f.enqueue(t, msg(topic))[0]
			f.set(t, id, "status", "dead", "attempts", 3, "last_error", "x", "finished_at", -time.Duration(3-i)*time.Minute, "requeues", i)
			dead = append(dead, id)
		}
		ready := f.enqueue(t, msg("a"))
		listed, err := f.Table.List(ctx, f.DB, lifecycle.Dead, "", 0)
		if err != nil || len(listed) != 3 {
			t.Fatalf("list %+v, %v", listed, err)
		}
		for i, m := range listed {
			if m.ID != dead[i] || m.FinishedAt == nil || m.LastError == nil || *m.LastError != "x" || m.Attempts != 3 || m.Requeues != i ||
				m.EnqueuedAt.IsZero() || !f.within(m.Now.Sub(*m.FinishedAt), time.Duration(3-i)*time.Minute, time.Duration(3-i)*time.Minute+10*time.Second) {
				t.Errorf("listed %d: %+v", i, m)
			}
		}
		if listed, err := f.Table.List(ctx, f.DB, lifecycle.Dead, "a", 1); err != nil || len(listed) != 1 || listed[0].ID != dead[0] {
			t.Errorf("list of topic a, 1: %+v, %v", listed, err)
		}
		if listed, err := f.Table.List(ctx, f.DB, lifecycle.Ready, "", 0); err != nil || len(listed) != 1 || listed[0].ID != ready[0] ||
			listed[0].FinishedAt != nil || listed[0].LastError != nil || listed[0].Topic != "a" {
			t.Errorf("list of ready: %+v, %v", listed, err)
		}
	}},
	{"Sequenced", func(t *testing.T, tg Target) {
		// Messages enqueued at sequences their writer chose, from a row
		// source of another statement, are ready at once, read back by
		// Messages in id order, presented one at a time per ordering key;
		// a sequence written twice is refused by the unique index.
		f := newFixture(tg)
		d := f.Table.Dialect()
		insert := f.insertSequenced()
		for _, seq := range []int32{2, 3} {
			if err := f.DB.Exec(ctx, insert, "rec", seq, "state.payment", []byte(`{"v":1}`), `{"traceparent":"x"}`, "acme/payment/1"); err != nil {
				t.Fatalf("insert %d: %v", seq, err)
			}
		}
		err := f.DB.Exec(ctx, insert, "rec", int32(2), "state.payment", []byte(`{}`), `{}`, "acme/payment/1")
		if !d.UniqueViolation(err) {
			t.Errorf("a sequence written twice: %v, want a unique violation", err)
		}
		msgs, err := f.Table.Messages(ctx, f.DB, "rec")
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) != 2 || msgs[0].ID != "rec/2" || msgs[1].ID != "rec/3" || msgs[0].RowID >= msgs[1].RowID {
			t.Fatalf("messages %+v", msgs)
		}
		for _, m := range msgs {
			if m.State != lifecycle.Ready || m.Topic != "state.payment" || m.Headers["traceparent"] != "x" ||
				m.OrderingKey != "acme/payment/1" || string(m.Payload) != `{"v":1}` || m.EnqueuedAt.IsZero() {
				t.Errorf("message %+v", m)
			}
		}
		if others, err := f.Table.Messages(ctx, f.DB, "other"); err != nil || len(others) != 0 {
			t.Errorf("another key's messages: %+v, %v", others, err)
		}
		if r := f.row(t, "rec/2"); r.gap != 0 || r.dueIn > 0 {
			t.Errorf("rec/2: %+v, want due at its enqueue", r)
		}
		wantClaims(t, f, [][]string{{"rec/2"}, {"rec/3"}})
	}},
	{"SequencedRowsApart", func(t *testing.T, tg Target) {
		// Messages reads each row on its own: a row that cannot be read
		// (headers that are not a JSON object of strings, the engine's own
		// corruptions) comes back with its error naming the row and the
		// column, beside the storage key's other messages, read as they
		// are.
		f := newFixture(tg)
		insert := f.insertSequenced()
		seqs := 3 + len(tg.Corruptions)
		for seq := range int32(seqs) {
			if err := f.DB.Exec(ctx, insert, "rec", seq+1, "state.payment", []byte(`{"v":1}`), `{"k":"v"}`, "acme/payment/1"); err != nil {
				t.Fatalf("insert %d: %v", seq+1, err)
			}
		}
		bad := map[string]string{"rec/2": "column headers is not a JSON object of strings: json: cannot unmarshal array"}
		f.set(t, "rec/2", "headers", `["a"]`)
		for i, c := range tg.Corruptions {
			c.Corrupt(t, "rec", 4+i)
			bad[lifecycle.MessageID("rec", 4+i)] = c.Want
		}
		msgs, err := f.Table.Messages(ctx, f.DB, "rec")
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) != seqs {
			t.Fatalf("read %d messages, want %d", len(msgs), seqs)
		}
		for i, m := range msgs {
			want, isBad := bad[m.ID]
			switch {
			case m.Seq != i+1 || m.ID != lifecycle.MessageID("rec", i+1):
				t.Errorf("message %d: seq %d, ID %s", i, m.Seq, m.ID)
			case isBad && (m.Err == nil || !strings.Contains(m.Err.Error(), want) || !strings.Contains(m.Err.Error(), fmt.Sprintf("row %d", m.RowID))):
				t.Errorf("%s: error %v, want %q naming row %d", m.ID, m.Err, want, m.RowID)
			case !isBad && (m.Err != nil || m.State != lifecycle.Ready || m.Headers["k"] != "v" || string(m.Payload) != `{"v":1}`):
				t.Errorf("healthy %s: %+v", m.ID, m)
			}
		}
	}},
}
