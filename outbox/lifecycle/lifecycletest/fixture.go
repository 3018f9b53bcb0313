package lifecycletest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/outbox/lifecycle"
)

// The helpers of the tests: a subtest's fixture, and the statements the
// suite writes itself from the dialect's fragments, to put a row into a
// state and to read its columns.

// fixture is a subtest's target with the helpers of the tests.
type fixture struct {
	Target
	n int // records enqueued
}

func newFixture(tg Target) *fixture { return &fixture{Target: tg} }

// enqueue writes msgs as the messages of a new record, committed, and
// returns their IDs.
func (f *fixture) enqueue(t *testing.T, msgs ...lifecycle.NewMessage) []string {
	t.Helper()
	f.n++
	ids, err := f.enqueueAt(fmt.Sprintf("key-%d", f.n), msgs...)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// enqueueAt writes msgs as messages of the record storageKey in a
// transaction of their own.
func (f *fixture) enqueueAt(storageKey string, msgs ...lifecycle.NewMessage) ([]string, error) {
	var ids []string
	err := lifecycle.InTx(ctx, f.DB, func(db lifecycle.DB) error {
		var err error
		ids, err = f.Table.Enqueue(ctx, db, storageKey, msgs)
		return err
	})
	return ids, err
}

// msg is a ready message of topic.
func msg(topic string) lifecycle.NewMessage { return lifecycle.NewMessage{Topic: topic} }

// insertSequenced is InsertSequenced of one message, whose parameters are
// its storage key, seq, topic, payload, headers and ordering key, enqueued
// at the database's clock.
func (f *fixture) insertSequenced() string {
	d := f.Table.Dialect()
	return f.Table.InsertSequenced(`(SELECT ` + d.Param(1, "text") + ` AS storage_key, ` + d.Param(2, "integer") + ` AS seq, ` +
		d.Param(3, "text") + ` AS topic, ` + d.Param(4, "bytea") + ` AS payload, ` + d.Param(5, "text") + ` AS headers, ` +
		d.Param(6, "text") + ` AS ordering_key, ` + d.Now + ` AS enqueued_at)`)
}

// claim claims up to n messages under token for lease, by relay
// "relay-<token>".
func (f *fixture) claim(t *testing.T, token string, n int, lease time.Duration) []lifecycle.ClaimedMessage {
	t.Helper()
	got, err := f.Table.Claim(ctx, f.DB, token, "relay-"+token, lease, n)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func claimedIDs(ms []lifecycle.ClaimedMessage) []string {
	var ids []string
	for _, m := range ms {
		ids = append(ids, m.ID)
	}
	return ids
}

func changedIDs(cs []lifecycle.Changed) []string {
	var ids []string
	for _, c := range cs {
		ids = append(ids, c.ID)
	}
	return ids
}

// sameIDs reports whether a and b hold the same IDs, in any order.
func sameIDs(a, b []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}

// quoted returns the table's name quoted, each part of it.
func (f *fixture) quoted() string {
	parts := strings.Split(f.Table.Name(), ".")
	for i, p := range parts {
		parts[i] = `"` + strings.ReplaceAll(p, `"`, `""`) + `"`
	}
	return strings.Join(parts, ".")
}

// where is the condition on one message's row: its storage key $1 and
// sequence $2.
func (f *fixture) where() string {
	d := f.Table.Dialect()
	return "storage_key = " + d.Param(1, "text") + " AND seq = " + d.Param(2, "integer")
}

// idArgs returns the parameters of where for the message id.
func idArgs(t *testing.T, id string) []any {
	t.Helper()
	key, seq, err := lifecycle.ParseMessageID(id)
	if err != nil {
		t.Fatal(err)
	}
	return []any{key, int32(seq)}
}

// set writes values into columns of the row of the message id: a state an
// edge moves it from, a time, a column no edge writes so. pairs are
// column names, each followed by its value: nil (NULL), a string (JSON
// text for headers), an int, a []byte, or a time.Duration, for the
// database's clock moved by it.
func (f *fixture) set(t *testing.T, id string, pairs ...any) {
	t.Helper()
	d := f.Table.Dialect()
	args := idArgs(t, id)
	var sets []string
	for i := 0; i+1 < len(pairs); i += 2 {
		col, _ := pairs[i].(string)
		var expr string
		switch v := pairs[i+1].(type) {
		case nil:
			expr = "NULL"
		case string:
			args = append(args, v)
			expr = d.Param(len(args), "text")
			if col == "headers" {
				expr = d.JSON(expr)
			}
		case int:
			args = append(args, v)
			expr = d.Param(len(args), "integer")
		case []byte:
			args = append(args, v)
			expr = d.Param(len(args), "bytea")
		case time.Duration:
			args = append(args, v)
			expr = d.Shift(d.Now, len(args), 1)
		default:
			t.Fatalf("set %s: a value of %T", col, v)
		}
		sets = append(sets, col+" = "+expr)
	}
	sql := "UPDATE " + f.quoted() + " SET " + strings.Join(sets, ", ") + " WHERE " + f.where()
	if err := f.DB.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("set %v of %s: %v", pairs, id, err)
	}
}

// row is a message's row as the tests look at it.
type row struct {
	id              int64
	state           lifecycle.State
	attempts        int64
	lastError       string
	suspendedReason string
	token           string
	claimedBy       string
	requeues        int64
	requeuedBy      string
	enqueuedAt      time.Time
	dueAt           time.Time
	finished        bool
	// dueIn and claimLeft are from the database's clock at the read
	// (claimLeft 0 without a claim); gap is from enqueued_at to due_at.
	dueIn, claimLeft, gap time.Duration
}

// row reads the row of the message id.
func (f *fixture) row(t *testing.T, id string) row {
	t.Helper()
	r, ok := f.find(t, id)
	if !ok {
		t.Fatalf("row %s: not in the table", id)
	}
	return r
}

// find reads the row of the message id, and reports whether there is one.
func (f *fixture) find(t *testing.T, id string) (row, bool) {
	t.Helper()
	sql := `SELECT id, status, attempts, last_error, suspended_reason, claim_token, claimed_by, requeues, requeued_by,
	enqueued_at, due_at, finished_at, claim_until, ` + f.Table.Dialect().Now + `
FROM ` + f.quoted() + ` WHERE ` + f.where()
	var r row
	var lastError, reason, token, claimedBy, requeuedBy *string
	var finishedAt, claimUntil *time.Time
	var now time.Time
	err := lifecycle.QueryRow(ctx, f.DB, sql, idArgs(t, id), &r.id, &r.state, &r.attempts, &lastError, &reason, &token, &claimedBy,
		&r.requeues, &requeuedBy, &r.enqueuedAt, &r.dueAt, &finishedAt, &claimUntil, &now)
	if errors.Is(err, lifecycle.ErrNoRows) {
		return row{}, false
	}
	if err != nil {
		t.Fatalf("row %s: %v", id, err)
	}
	deref := func(s *string) string {
		if s == nil {
			return ""
		}
		return *s
	}
	r.lastError, r.suspendedReason, r.token, r.claimedBy, r.requeuedBy = deref(lastError), deref(reason), deref(token), deref(claimedBy), deref(requeuedBy)
	r.finished = finishedAt != nil
	r.dueIn, r.gap = r.dueAt.Sub(now), r.dueAt.Sub(r.enqueuedAt)
	if claimUntil != nil {
		r.claimLeft = claimUntil.Sub(now)
	}
	return r, true
}

// within reports whether d is in [lo, hi], widened by the clock's
// resolution.
func (f *fixture) within(d, lo, hi time.Duration) bool {
	return d >= lo-f.ClockResolution && d <= hi+f.ClockResolution
}
