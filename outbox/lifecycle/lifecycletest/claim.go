package lifecycletest

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/outbox/lifecycle"
)

var claimTests = []test{
	{"OrderingKey", func(t *testing.T, tg Target) {
		// A claim takes the due messages (scheduled, ready or waiting for
		// a retry, their due time passed), one per ordering key, in id
		// order within a key: an earlier message not finished (suspended
		// and scheduled included) holds the later ones back; a finished
		// one holds nothing.
		f := newFixture(tg)
		a := f.enqueue(t, msg("a1"), msg("a2"))                                                               // one key: one at a time
		b := f.enqueue(t, lifecycle.NewMessage{Topic: "b1", NotBefore: time.Now().Add(time.Hour)}, msg("b2")) // held by a scheduled one
		c := f.enqueue(t, msg("c1"), msg("c2"))                                                               // held by a suspended one
		d := f.enqueue(t, msg("d1"))                                                                          // waiting for a retry, due
		e := f.enqueue(t, msg("e1"))                                                                          // waiting for a retry, not due
		g := f.enqueue(t, msg("g1"), msg("g2"))                                                               // the first dead: blocks nothing
		h := f.enqueue(t, msg("h1"), msg("h2"))                                                               // the first canceled: blocks nothing
		f.set(t, c[0], "status", "suspended", "suspended_reason", "test")
		f.set(t, d[0], "status", "retry_wait", "attempts", 1, "due_at", -time.Second)
		f.set(t, e[0], "status", "retry_wait", "attempts", 1, "due_at", time.Hour)
		f.set(t, g[0], "status", "dead", "finished_at", time.Duration(0))
		if _, err := f.Table.Cancel(ctx, f.DB, h[:1], "test"); err != nil {
			t.Fatal(err)
		}

		got := f.claim(t, "t1", 100, time.Minute)
		if ids, want := claimedIDs(got), []string{a[0], d[0], g[1], h[1]}; !slices.Equal(ids, want) {
			t.Fatalf("claimed %v, want %v", ids, want)
		}
		if got[1].Attempts != 1 || got[0].Attempts != 0 {
			t.Errorf("attempts %d and %d, want 0 and 1 (the retry's)", got[0].Attempts, got[1].Attempts)
		}
		// Nothing more is due: a's second waits for its claimed first,
		// b's and c's for their first, e's for its backoff.
		if more := f.claim(t, "t2", 100, time.Minute); len(more) != 0 {
			t.Errorf("a second claim took %v", claimedIDs(more))
		}
		if _, err := f.Table.Done(ctx, f.DB, "t1", []int64{got[0].RowID}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.Table.Resume(ctx, f.DB, lifecycle.Selector{IDs: c[:1]}); err != nil {
			t.Fatal(err)
		}
		if more := f.claim(t, "t3", 100, time.Minute); !slices.Equal(claimedIDs(more), []string{a[1], c[0]}) {
			t.Errorf("after a's first is done and c's resumed: %v, want %s and %s", claimedIDs(more), a[1], c[0])
		}
		if r := f.row(t, b[1]); r.state != lifecycle.Ready {
			t.Errorf("%s held back: %+v", b[1], r)
		}
	}},
	{"Limit", func(t *testing.T, tg Target) {
		// A claim takes at most its limit, the earliest due first, and
		// returns them in id order.
		f := newFixture(tg)
		var ids []string
		for i := range 5 {
			ids = append(ids, f.enqueue(t, msg(fmt.Sprint("m", i)))...)
		}
		f.set(t, ids[3], "due_at", -2*time.Hour)
		f.set(t, ids[1], "due_at", -time.Hour)
		if got := claimedIDs(f.claim(t, "t1", 2, time.Minute)); !slices.Equal(got, []string{ids[1], ids[3]}) {
			t.Errorf("claimed %v, want the two earliest due, %s and %s", got, ids[1], ids[3])
		}
		if got := claimedIDs(f.claim(t, "t2", 10, time.Minute)); !slices.Equal(got, []string{ids[0], ids[2], ids[4]}) {
			t.Errorf("then claimed %v, want the rest", got)
		}
	}},
	{"Lease", func(t *testing.T, tg Target) {
		// A claimed message holds the claim's token and relay, and a claim
		// that runs for the lease from the database's clock.
		f := newFixture(tg)
		ids := f.enqueue(t, msg("a"))
		got := f.claim(t, "t1", 10, time.Minute)
		if len(got) != 1 || got[0].Err != nil {
			t.Fatalf("claimed %+v", got)
		}
		r := f.row(t, ids[0])
		if r.state != lifecycle.Claimed || r.token != "t1" || r.claimedBy != "relay-t1" || r.id != got[0].RowID ||
			!f.within(r.claimLeft, 55*time.Second, time.Minute) || r.attempts != 0 {
			t.Errorf("after the claim: %+v", r)
		}
		if !got[0].EnqueuedAt.Equal(r.enqueuedAt) {
			t.Errorf("claimed enqueued at %v, the row at %v", got[0].EnqueuedAt, r.enqueuedAt)
		}
	}},
	{"Partition", func(t *testing.T, tg Target) {
		// Concurrent claims of one message each partition the due
		// messages: each is claimed once.
		f := newFixture(tg)
		var all []string
		for range 20 {
			all = append(all, f.enqueue(t, msg("p"))...)
		}
		var mu sync.Mutex
		seen := map[string]int{}
		var wg sync.WaitGroup
		start := make(chan struct{})
		for w := range 4 {
			wg.Go(func() {
				<-start
				for {
					got, err := f.Table.Claim(ctx, f.DB, fmt.Sprint("w", w), "w", time.Minute, 1)
					if err != nil {
						t.Error(err)
						return
					}
					if len(got) == 0 {
						return
					}
					mu.Lock()
					seen[got[0].ID]++
					mu.Unlock()
				}
			})
		}
		close(start)
		wg.Wait()
		for _, id := range all {
			if seen[id] != 1 {
				t.Errorf("%s claimed %d times, want 1", id, seen[id])
			}
		}
	}},
	{"Scheduled", func(t *testing.T, tg Target) {
		// A scheduled message is not claimed before its NotBefore, and is
		// once that time has passed; meanwhile the relay's state says when
		// it falls due.
		f := newFixture(tg)
		notBefore := time.Now().Add(300 * time.Millisecond)
		ids := f.enqueue(t, lifecycle.NewMessage{Topic: "later", NotBefore: notBefore})
		if got := f.claim(t, "t", 10, time.Minute); len(got) != 0 {
			t.Fatalf("claimed %v before its NotBefore", claimedIDs(got))
		}
		st, err := f.Table.RelayState(ctx, f.DB)
		if err != nil || !f.within(st.NextDue, time.Nanosecond, 300*time.Millisecond) || st.Lag != 0 || st.NextExpiry != 0 {
			t.Errorf("relay state %+v, %v: want the next due within 300ms, no lag", st, err)
		}
		// The schedule is on the database's clock, read against this one.
		time.Sleep(time.Until(notBefore) + 10*time.Millisecond + tg.ClockResolution)
		got := f.claim(t, "t", 10, time.Minute)
		if !slices.Equal(claimedIDs(got), ids) {
			t.Fatalf("claimed %v after its NotBefore, want %v", claimedIDs(got), ids)
		}
		if time.Now().Before(notBefore) {
			t.Error("claimed before its NotBefore")
		}
	}},
	{"RowsApart", func(t *testing.T, tg Target) {
		// A claimed row that cannot be read (headers that are not a JSON
		// object of strings, and the engine's own corruptions) comes back
		// with its error naming the row, alone; the other rows of the
		// claim are read as they are.
		f := newFixture(tg)
		var good []string
		for range 4 {
			good = append(good, f.enqueue(t, lifecycle.NewMessage{Topic: "good", Payload: []byte("ok"), Headers: map[string]string{"k": "v"}})...)
		}
		bad := map[string]string{}
		for _, c := range []struct{ headers, want string }{
			{`{"retries": 3}`, "column headers is not a JSON object of strings: json: cannot unmarshal number"},
			{`null`, "column headers is not a JSON object of strings: null"},
			{`["a"]`, "column headers is not a JSON object of strings: json: cannot unmarshal array"},
		} {
			id := f.enqueue(t, msg("bad"))[0]
			f.set(t, id, "headers", c.headers)
			bad[id] = c.want
		}
		name := map[string]string{}
		for _, c := range tg.Corruptions {
			id := f.enqueue(t, msg("bad"))[0]
			key, seq, _ := lifecycle.ParseMessageID(id)
			c.Corrupt(t, key, seq)
			bad[id], name[id] = c.Want, c.Name+" "
		}
		got := f.claim(t, "t", 100, time.Minute)
		if len(got) != len(good)+len(bad) {
			t.Fatalf("claimed %d, want %d", len(got), len(good)+len(bad))
		}
		for _, m := range got {
			want, isBad := bad[m.ID]
			switch {
			case isBad && (m.Err == nil || !strings.Contains(m.Err.Error(), want)):
				t.Errorf("%s%s: error %v, want %q", name[m.ID], m.ID, m.Err, want)
			case isBad && !strings.Contains(m.Err.Error(), fmt.Sprintf("row %d", m.RowID)):
				t.Errorf("%s%s: error %v does not name row %d", name[m.ID], m.ID, m.Err, m.RowID)
			case !isBad && (m.Err != nil || string(m.Payload) != "ok" || m.Headers["k"] != "v" || m.Topic != "good"):
				t.Errorf("healthy %s: %+v", m.ID, m)
			}
		}
		// The relay sets each apart, dead with its error.
		for _, m := range got {
			if m.Err == nil {
				continue
			}
			if mark, err := f.Table.Unreadable(ctx, f.DB, "t", m.RowID, m.Err); err != nil || mark.State != lifecycle.Dead {
				t.Errorf("%s set apart: %+v, %v", m.ID, mark, err)
			}
		}
		if st, err := f.Table.Status(ctx, f.DB, 10); err != nil || st.Counts[lifecycle.Dead] != int64(len(bad)) {
			t.Errorf("status %+v, %v: want %d dead", st, err, len(bad))
		}
	}},
}
