package lifecycletest

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/outbox/lifecycle"
)

// claimed enqueues n messages, each of a record of its own, claims them
// under token t1 for a minute, and returns their IDs and rows.
func (f *fixture) claimed(t *testing.T, n int) ([]string, []int64) {
	t.Helper()
	return f.claimedFor(t, n, time.Minute)
}

var markTests = []test{
	{"Extend", func(t *testing.T, tg Target) {
		// An extend pushes the claim of the messages held under the token
		// to the lease from the database's clock, and returns those; one
		// canceled, suspended or claimed under another token is neither
		// extended nor returned.
		f := newFixture(tg)
		ids, rows := f.claimedFor(t, 4, time.Second)
		if _, err := f.Table.Cancel(ctx, f.DB, ids[1:2], "test"); err != nil {
			t.Fatal(err)
		}
		if _, err := f.Table.Suspend(ctx, f.DB, lifecycle.Selector{IDs: ids[2:3]}, "test"); err != nil {
			t.Fatal(err)
		}
		held, err := f.Table.Extend(ctx, f.DB, "t1", rows, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if want := []int64{rows[0], rows[3]}; !slices.Equal(slices.Sorted(slices.Values(held)), want) {
			t.Errorf("held %v, want %v", held, want)
		}
		if r := f.row(t, ids[0]); !f.within(r.claimLeft, 55*time.Second, time.Minute) || r.state != lifecycle.Claimed {
			t.Errorf("after an extend of a minute: %+v", r)
		}
		if held, err := f.Table.Extend(ctx, f.DB, "other", rows, time.Hour); err != nil || len(held) != 0 {
			t.Errorf("extend under another token: %v, %v", held, err)
		}
		if r := f.row(t, ids[3]); r.claimLeft > time.Minute+tg.ClockResolution {
			t.Errorf("extended under another token: %+v", r)
		}
		if held, err := f.Table.Extend(ctx, f.DB, "t1", nil, time.Minute); err != nil || held != nil {
			t.Errorf("extend of no rows: %v, %v", held, err)
		}
	}},
	{"Fenced", func(t *testing.T, tg Target) {
		// Every mark under another token changes nothing: done, release
		// and extend return no rows, the marks of one message
		// ErrNotClaimed.
		f := newFixture(tg)
		ids, rows := f.claimed(t, 1)
		for name, mark := range map[string]func() error{
			"done": func() error { return noRows(f.Table.Done(ctx, f.DB, "other", rows)) },
			"release": func() error {
				return noRows(f.Table.Release(ctx, f.DB, "other", rows))
			},
			"retry": func() error {
				_, err := f.Table.Retry(ctx, f.DB, "other", rows[0], 5, time.Second, "x")
				return notClaimed(err)
			},
			"refuse": func() error {
				_, err := f.Table.Refuse(ctx, f.DB, "other", rows[0], "x")
				return notClaimed(err)
			},
			"unreadable": func() error {
				_, err := f.Table.Unreadable(ctx, f.DB, "other", rows[0], errors.New("x"))
				return notClaimed(err)
			},
			"sink-suspend": func() error {
				_, err := f.Table.SinkSuspend(ctx, f.DB, "other", rows[0], "x")
				return notClaimed(err)
			},
		} {
			if err := mark(); err != nil {
				t.Errorf("%s under another token: %v", name, err)
			}
		}
		if r := f.row(t, ids[0]); r.state != lifecycle.Claimed || r.attempts != 0 || r.token != "t1" || r.lastError != "" {
			t.Fatalf("fenced marks changed %+v", r)
		}
	}},
	{"Done", func(t *testing.T, tg Target) {
		// Done marks the messages claimed under the token done, finished,
		// their attempt counted, the claim cleared; once only.
		f := newFixture(tg)
		ids, rows := f.claimed(t, 2)
		marked, err := f.Table.Done(ctx, f.DB, "t1", rows)
		if err != nil || !slices.Equal(slices.Sorted(slices.Values(marked)), rows) {
			t.Errorf("done: %v, %v; want %v", marked, err, rows)
		}
		for _, id := range ids {
			if r := f.row(t, id); r.state != lifecycle.Done || r.attempts != 1 || !r.finished || r.token != "" || r.claimLeft != 0 {
				t.Errorf("done: %+v", r)
			}
		}
		if again, err := f.Table.Done(ctx, f.DB, "t1", rows); err != nil || len(again) != 0 {
			t.Errorf("done again: %v, %v", again, err)
		}
	}},
	{"Release", func(t *testing.T, tg Target) {
		// Release hands a claimed message back: ready, due as it was, no
		// attempt counted; it is claimed again.
		f := newFixture(tg)
		ids, rows := f.claimed(t, 1)
		due := f.row(t, ids[0]).dueAt
		if released, err := f.Table.Release(ctx, f.DB, "t1", rows); err != nil || !slices.Equal(released, rows) {
			t.Errorf("release: %v, %v", released, err)
		}
		if r := f.row(t, ids[0]); r.state != lifecycle.Ready || r.attempts != 0 || r.token != "" || r.claimLeft != 0 || !r.dueAt.Equal(due) {
			t.Errorf("released: %+v, want ready, due at %v", r, due)
		}
		if got := claimedIDs(f.claim(t, "t2", 10, time.Minute)); !slices.Equal(got, ids) {
			t.Errorf("claimed again: %v", got)
		}
	}},
	{"Retry", func(t *testing.T, tg Target) {
		// Retry records a failed presentation: waiting for a retry due
		// after the backoff, its error kept; dead, finished, at the cap.
		f := newFixture(tg)
		ids, rows := f.claimed(t, 2)
		m, err := f.Table.Retry(ctx, f.DB, "t1", rows[0], 5, time.Hour, "publish_failed: nak")
		if r := f.row(t, ids[0]); err != nil || m != (lifecycle.Mark{State: lifecycle.RetryWait, Attempts: 1}) ||
			r.state != lifecycle.RetryWait || r.lastError != "publish_failed: nak" || !f.within(r.dueIn, 59*time.Minute, time.Hour) ||
			r.finished || r.token != "" {
			t.Errorf("retry: %+v, %v; row %+v", m, err, r)
		}
		f.set(t, ids[1], "attempts", 4)
		m, err = f.Table.Retry(ctx, f.DB, "t1", rows[1], 5, time.Hour, "publish_failed: nak")
		if r := f.row(t, ids[1]); err != nil || m != (lifecycle.Mark{State: lifecycle.Dead, Attempts: 5}) || r.state != lifecycle.Dead || !r.finished {
			t.Errorf("retry at the cap: %+v, %v; row %+v", m, err, r)
		}
		// Waiting for its backoff, the first is not claimed; due, it is.
		if got := f.claim(t, "t2", 10, time.Minute); len(got) != 0 {
			t.Errorf("claimed %v during the backoff", claimedIDs(got))
		}
		f.set(t, ids[0], "due_at", -time.Second)
		if got := f.claim(t, "t2", 10, time.Minute); !slices.Equal(claimedIDs(got), ids[:1]) || got[0].Attempts != 1 {
			t.Errorf("claimed after the backoff: %+v", got)
		}
	}},
	{"Refuse", func(t *testing.T, tg Target) {
		// Refuse: the sink refused the message for good: dead at once, its
		// attempt counted, the reason its last error.
		f := newFixture(tg)
		ids, rows := f.claimed(t, 1)
		m, err := f.Table.Refuse(ctx, f.DB, "t1", rows[0], "refused: invalid subject")
		if r := f.row(t, ids[0]); err != nil || m != (lifecycle.Mark{State: lifecycle.Dead, Attempts: 1}) || r.state != lifecycle.Dead ||
			r.attempts != 1 || r.lastError != "refused: invalid subject" || !r.finished || r.token != "" {
			t.Errorf("refuse: %+v, %v; row %+v", m, err, r)
		}
	}},
	{"Unreadable", func(t *testing.T, tg Target) {
		// Unreadable sets a row the relay could not read apart: dead at
		// once, its attempt counted, "unreadable: <error>".
		f := newFixture(tg)
		ids, rows := f.claimed(t, 1)
		m, err := f.Table.Unreadable(ctx, f.DB, "t1", rows[0], errors.New("row 7: column headers is NULL"))
		if r := f.row(t, ids[0]); err != nil || m.State != lifecycle.Dead || r.state != lifecycle.Dead ||
			r.lastError != "unreadable: row 7: column headers is NULL" || r.attempts != 1 || !r.finished {
			t.Errorf("unreadable: %+v, %v; row %+v", m, err, r)
		}
	}},
	{"SinkSuspend", func(t *testing.T, tg Target) {
		// SinkSuspend: the sink asked the message to wait: suspended with
		// the reason, its claim cleared, no attempt counted; not claimed
		// until resumed.
		f := newFixture(tg)
		ids, rows := f.claimed(t, 1)
		m, err := f.Table.SinkSuspend(ctx, f.DB, "t1", rows[0], "budget exhausted")
		if r := f.row(t, ids[0]); err != nil || m != (lifecycle.Mark{State: lifecycle.Suspended, Attempts: 0}) || r.state != lifecycle.Suspended ||
			r.attempts != 0 || r.suspendedReason != "budget exhausted" || r.token != "" || r.finished {
			t.Errorf("sink-suspend: %+v, %v; row %+v", m, err, r)
		}
		if got := f.claim(t, "t2", 10, time.Minute); len(got) != 0 {
			t.Errorf("claimed %v while suspended", claimedIDs(got))
		}
	}},
	{"Text", func(t *testing.T, tg Target) {
		// The text a mark keeps is valid UTF-8 without NUL bytes, cut to
		// MaxText bytes at a character boundary.
		f := newFixture(tg)
		ids, rows := f.claimed(t, 2)
		if _, err := f.Table.Retry(ctx, f.DB, "t1", rows[0], 5, time.Second, "publish_failed: nak\x00\xff"); err != nil {
			t.Fatal(err)
		}
		if r := f.row(t, ids[0]); r.lastError != "publish_failed: nak\uFFFD" {
			t.Errorf("last error %q", r.lastError)
		}
		long := strings.Repeat("é", lifecycle.MaxText)
		if _, err := f.Table.SinkSuspend(ctx, f.DB, "t1", rows[1], long); err != nil {
			t.Fatal(err)
		}
		if r := f.row(t, ids[1]); len(r.suspendedReason) > lifecycle.MaxText || len(r.suspendedReason) < lifecycle.MaxText-1 ||
			!strings.HasPrefix(long, r.suspendedReason) {
			t.Errorf("a reason of %d bytes kept as %d", len(long), len(r.suspendedReason))
		}
	}},
}

// claimedFor is claimed with a lease of its own.
func (f *fixture) claimedFor(t *testing.T, n int, lease time.Duration) ([]string, []int64) {
	t.Helper()
	var ids []string
	for range n {
		ids = append(ids, f.enqueue(t, msg("t"))...)
	}
	got := f.claim(t, "t1", n, lease)
	if !slices.Equal(claimedIDs(got), ids) {
		t.Fatalf("claimed %v, want %v", claimedIDs(got), ids)
	}
	rows := make([]int64, len(got))
	for i, m := range got {
		rows[i] = m.RowID
	}
	return ids, rows
}

// noRows is the error of a mark of several rows that changed some.
func noRows(got []int64, err error) error {
	if err == nil && len(got) != 0 {
		return errors.New("changed rows")
	}
	return err
}

// notClaimed is the error of a mark of one row that did not wrap
// ErrNotClaimed.
func notClaimed(err error) error {
	if !errors.Is(err, lifecycle.ErrNotClaimed) {
		return errors.Join(errors.New("want ErrNotClaimed"), err)
	}
	return nil
}
