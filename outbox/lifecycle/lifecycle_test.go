package lifecycle_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency/internal/outboxtest"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
)

var ctx = context.Background()

// The handles the package documents are DBs.
var (
	_ lifecycle.DB = (*pgxpool.Pool)(nil)
	_ lifecycle.DB = (*pgx.Conn)(nil)
	_ lifecycle.DB = pgx.Tx(nil)
)

// fixture is a database of its own with the outbox table, and the table's
// edges.
type fixture struct {
	*outboxtest.DB
	t *lifecycle.Table
	n int // records enqueued
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	tb, err := lifecycle.New("idempotency_outbox", lifecycle.PostgreSQL)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{DB: outboxtest.NewDB(t), t: tb}
}

// enqueue writes msgs as the messages of a new record, committed, and
// returns their IDs.
func (f *fixture) enqueue(t *testing.T, msgs ...lifecycle.NewMessage) []string {
	t.Helper()
	f.n++
	var ids []string
	err := pgx.BeginFunc(ctx, f.Pool, func(tx pgx.Tx) error {
		var err error
		ids, err = f.t.Enqueue(ctx, tx, fmt.Sprintf("key-%d", f.n), msgs)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// msg is a ready message of topic t.
func msg(topic string) lifecycle.NewMessage { return lifecycle.NewMessage{Topic: topic} }

// row is a message's row as the tests look at it.
type row struct {
	id               int64
	state            lifecycle.State
	attempts         int
	lastError        string
	suspendedReason  string
	token            string
	dueIn            time.Duration // due_at from the server's clock
	finished         bool
	requeues         int
	requeuedBy       string
	claimLeft        time.Duration
	enqueuedToDueGap time.Duration
}

// row reads the row of the message id.
func (f *fixture) row(t *testing.T, id string) row {
	t.Helper()
	key, seq, err := lifecycle.ParseMessageID(id)
	if err != nil {
		t.Fatal(err)
	}
	var r row
	var attempts, requeues int32
	var dueIn, claimLeft, gap float64
	err = f.Pool.QueryRow(ctx, `
SELECT id, status, attempts, coalesce(last_error, ''), coalesce(suspended_reason, ''), coalesce(claim_token, ''),
	extract(epoch FROM due_at - clock_timestamp())::float8, finished_at IS NOT NULL, requeues, coalesce(requeued_by, ''),
	coalesce(extract(epoch FROM claim_until - clock_timestamp())::float8, 0), extract(epoch FROM due_at - enqueued_at)::float8
FROM idempotency_outbox WHERE storage_key = $1 AND seq = $2`, key, seq).
		Scan(&r.id, &r.state, &attempts, &r.lastError, &r.suspendedReason, &r.token, &dueIn, &r.finished, &requeues, &r.requeuedBy, &claimLeft, &gap)
	if err != nil {
		t.Fatalf("row %s: %v", id, err)
	}
	r.attempts, r.requeues = int(attempts), int(requeues)
	r.dueIn, r.claimLeft = time.Duration(dueIn*float64(time.Second)), time.Duration(claimLeft*float64(time.Second))
	r.enqueuedToDueGap = time.Duration(gap * float64(time.Second))
	return r
}

// set writes SQL assignments into the row of id: a state the test needs.
func (f *fixture) set(t *testing.T, id, assignments string) {
	t.Helper()
	key, seq, _ := lifecycle.ParseMessageID(id)
	if _, err := f.Pool.Exec(ctx, `UPDATE idempotency_outbox SET `+assignments+` WHERE storage_key = $1 AND seq = $2`, key, seq); err != nil {
		t.Fatal(err)
	}
}

// claim claims up to n messages under token for lease, and returns their
// IDs.
func (f *fixture) claim(t *testing.T, token string, n int, lease time.Duration) []lifecycle.ClaimedMessage {
	t.Helper()
	got, err := f.t.Claim(ctx, f.Pool, token, "relay-"+token, lease, n)
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

// TestEnqueue: messages are ready and due now, or scheduled and due at
// their NotBefore when it is later than the server's clock; the IDs
// continue the record's sequence; the relays are notified at the commit.
func TestEnqueue(t *testing.T) {
	f := newFixture(t)
	listener, err := pgx.Connect(ctx, f.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(ctx)
	if _, err := listener.Exec(ctx, `LISTEN idempotency_outbox`); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	ids := f.enqueue(t, lifecycle.NewMessage{Topic: "a", Payload: []byte("p"), Headers: map[string]string{"h": "v"}},
		lifecycle.NewMessage{Topic: "b", NotBefore: later, OrderingKey: "acct"},
		lifecycle.NewMessage{Topic: "c", NotBefore: time.Now().Add(-time.Hour)})
	if want := []string{"key-1/1", "key-1/2", "key-1/3"}; !slices.Equal(ids, want) {
		t.Fatalf("IDs %v, want %v", ids, want)
	}
	if r := f.row(t, ids[0]); r.state != lifecycle.Ready || r.dueIn > 0 || r.enqueuedToDueGap != 0 || r.attempts != 0 {
		t.Errorf("first message %+v, want ready, due at its enqueue", r)
	}
	if r := f.row(t, ids[1]); r.state != lifecycle.Scheduled || r.dueIn < 59*time.Minute || r.dueIn > time.Hour {
		t.Errorf("scheduled message %+v, want scheduled, due in an hour", r)
	}
	if r := f.row(t, ids[2]); r.state != lifecycle.Ready || r.enqueuedToDueGap != 0 {
		t.Errorf("a NotBefore in the past: %+v, want ready, due at its enqueue", r)
	}
	nctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if n, err := listener.WaitForNotification(nctx); err != nil || n.Channel != "idempotency_outbox" {
		t.Errorf("notification %+v, %v", n, err)
	}
	// The sequence continues in the same record.
	var more []string
	err = pgx.BeginFunc(ctx, f.Pool, func(tx pgx.Tx) error {
		var err error
		more, err = f.t.Enqueue(ctx, tx, "key-1", []lifecycle.NewMessage{msg("d")})
		return err
	})
	if err != nil || !slices.Equal(more, []string{"key-1/4"}) {
		t.Errorf("enqueue again: %v, %v", more, err)
	}
	var orderingKey string
	if err := f.Pool.QueryRow(ctx, `SELECT string_agg(ordering_key, ',' ORDER BY seq) FROM idempotency_outbox`).Scan(&orderingKey); err != nil || orderingKey != "key-1,acct,key-1,key-1" {
		t.Errorf("ordering keys %q, %v", orderingKey, err)
	}
}

// TestClaim: a claim takes due messages (scheduled, ready or waiting for a
// retry, their due time passed) up to its limit, one per ordering key, in
// id order within a key: an earlier message not finished, suspended or
// scheduled included, holds the later ones back. Concurrent claims
// partition the due messages.
func TestClaim(t *testing.T) {
	f := newFixture(t)
	a := f.enqueue(t, msg("a1"), msg("a2"))                                                               // one key: one at a time
	b := f.enqueue(t, lifecycle.NewMessage{Topic: "b1", NotBefore: time.Now().Add(time.Hour)}, msg("b2")) // held by a scheduled one
	c := f.enqueue(t, msg("c1"), msg("c2"))                                                               // held by a suspended one
	d := f.enqueue(t, msg("d1"))                                                                          // waiting for a retry, due
	e := f.enqueue(t, msg("e1"))                                                                          // waiting for a retry, not due
	g := f.enqueue(t, msg("g1"), msg("g2"))                                                               // the first dead: blocks nothing
	f.set(t, c[0], `status = 'suspended'`)
	f.set(t, d[0], `status = 'retry_wait', attempts = 1, due_at = clock_timestamp() - interval '1 second'`)
	f.set(t, e[0], `status = 'retry_wait', attempts = 1, due_at = clock_timestamp() + interval '1 hour'`)
	f.set(t, g[0], `status = 'dead', finished_at = clock_timestamp()`)

	got := f.claim(t, "t1", 100, time.Minute)
	want := []string{a[0], d[0], g[1]}
	if ids := claimedIDs(got); !slices.Equal(ids, want) {
		t.Fatalf("claimed %v, want %v", ids, want)
	}
	for _, m := range got {
		r := f.row(t, m.ID)
		if r.state != lifecycle.Claimed || r.token != "t1" || r.claimLeft < 55*time.Second || r.claimLeft > time.Minute || m.Err != nil {
			t.Errorf("%s after the claim: %+v (%v)", m.ID, r, m.Err)
		}
	}
	if got[1].Attempts != 1 || got[0].Topic != "a1" || got[0].EnqueuedAt.IsZero() || got[0].Headers == nil {
		t.Errorf("claimed messages %+v", got)
	}
	// Nothing more is due: a's second waits for its first, b's and c's
	// for their first, e's for its backoff.
	if more := f.claim(t, "t2", 100, time.Minute); len(more) != 0 {
		t.Errorf("a second claim took %v", claimedIDs(more))
	}
	if _, err := f.t.Done(ctx, f.Pool, "t1", []int64{f.row(t, a[0]).id}); err != nil {
		t.Fatal(err)
	}
	if more := f.claim(t, "t2", 100, time.Minute); !slices.Equal(claimedIDs(more), []string{a[1]}) {
		t.Errorf("after a's first is done: %v, want %s", claimedIDs(more), a[1])
	}
	_ = b

	// Concurrent claims of one message each partition 20 keys.
	var all []string
	for range 20 {
		all = append(all, f.enqueue(t, msg("p"))...)
	}
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for {
				got, err := f.t.Claim(ctx, f.Pool, fmt.Sprint("w", w), "w", time.Minute, 1)
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
	wg.Wait()
	for _, id := range all {
		if seen[id] != 1 {
			t.Errorf("%s claimed %d times, want 1", id, seen[id])
		}
	}
}

// TestClaimScheduled: a scheduled message is not claimed before its
// NotBefore, and is once that time has passed.
func TestClaimScheduled(t *testing.T) {
	f := newFixture(t)
	notBefore := time.Now().Add(300 * time.Millisecond)
	ids := f.enqueue(t, lifecycle.NewMessage{Topic: "later", NotBefore: notBefore})
	if got := f.claim(t, "t", 10, time.Minute); len(got) != 0 {
		t.Fatalf("claimed %v before its NotBefore", claimedIDs(got))
	}
	st, err := f.t.RelayState(ctx, f.Pool)
	if err != nil || st.NextDue <= 0 || st.NextDue > 300*time.Millisecond || st.Lag != 0 {
		t.Errorf("relay state %+v, %v: want the next due within 300ms, no lag", st, err)
	}
	time.Sleep(time.Until(notBefore) + 10*time.Millisecond) // the schedule is the server's clock against this one
	got := f.claim(t, "t", 10, time.Minute)
	if !slices.Equal(claimedIDs(got), ids) {
		t.Fatalf("claimed %v after its NotBefore, want %v", claimedIDs(got), ids)
	}
	if time.Now().Before(notBefore) {
		t.Error("claimed before its NotBefore")
	}
}

// TestClaimReadsRowsApart: a claimed row that cannot be read (headers that
// are not a JSON object of strings, an infinite time, a NULL) comes back
// with its error, alone; the other rows of the claim are read as they are.
func TestClaimReadsRowsApart(t *testing.T) {
	f := newFixture(t)
	// Another producer's table: a column left nullable.
	if _, err := f.Pool.Exec(ctx, `ALTER TABLE idempotency_outbox ALTER COLUMN payload DROP NOT NULL`); err != nil {
		t.Fatal(err)
	}
	var good []string
	for range 4 {
		good = append(good, f.enqueue(t, lifecycle.NewMessage{Topic: "good", Payload: []byte("ok"), Headers: map[string]string{"k": "v"}})...)
	}
	bad := map[string]string{}
	for _, c := range []struct{ set, want string }{
		{`headers = '{"retries": 3}'`, "column headers is not a JSON object of strings: json: cannot unmarshal number"},
		{`headers = 'null'`, "column headers is not a JSON object of strings: null"},
		{`headers = '["a"]'`, "column headers is not a JSON object of strings: json: cannot unmarshal array"},
		{`enqueued_at = 'infinity'`, "column enqueued_at: cannot scan Infinity into *time.Time"},
		{`payload = NULL`, "column payload is NULL"},
	} {
		id := f.enqueue(t, msg("bad"))[0]
		f.set(t, id, c.set)
		bad[id] = c.want
	}
	got := f.claim(t, "t", 100, time.Minute)
	if len(got) != len(good)+len(bad) {
		t.Fatalf("claimed %d, want %d", len(got), len(good)+len(bad))
	}
	for _, m := range got {
		want, isBad := bad[m.ID]
		switch {
		case isBad && (m.Err == nil || !strings.Contains(m.Err.Error(), want)):
			t.Errorf("%s: error %v, want %q", m.ID, m.Err, want)
		case isBad && !strings.Contains(m.Err.Error(), fmt.Sprintf("row %d", m.RowID)):
			t.Errorf("%s: error %v does not name row %d", m.ID, m.Err, m.RowID)
		case !isBad && (m.Err != nil || string(m.Payload) != "ok" || m.Headers["k"] != "v" || m.Topic != "good"):
			t.Errorf("healthy %s: %+v", m.ID, m)
		}
	}
}

// TestExtend: an extend pushes the claim of the messages held under the
// token, and returns those; one canceled, suspended or claimed under
// another token is not extended nor returned.
func TestExtend(t *testing.T) {
	f := newFixture(t)
	var ids []string
	for range 4 {
		ids = append(ids, f.enqueue(t, msg("t"))...)
	}
	got := f.claim(t, "t1", 10, time.Second)
	rows := make([]int64, len(got))
	for i, m := range got {
		rows[i] = m.RowID
	}
	if _, err := f.t.Cancel(ctx, f.Pool, []string{ids[1]}, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.t.Suspend(ctx, f.Pool, lifecycle.Selector{IDs: ids[2:3]}, "test"); err != nil {
		t.Fatal(err)
	}
	held, err := f.t.Extend(ctx, f.Pool, "t1", rows, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{rows[0], rows[3]}; !slices.Equal(slices.Sorted(slices.Values(held)), want) {
		t.Errorf("held %v, want %v", held, want)
	}
	if r := f.row(t, ids[0]); r.claimLeft < 55*time.Second {
		t.Errorf("claim left %v after an extend of a minute", r.claimLeft)
	}
	if held, err := f.t.Extend(ctx, f.Pool, "other", rows, time.Minute); err != nil || len(held) != 0 {
		t.Errorf("extend under another token: %v, %v", held, err)
	}
}

// TestMarks: done, release, retry, refuse, unreadable and sink-suspend
// change a message only while it is claimed under the token, and leave it
// as the package documentation's table says.
func TestMarks(t *testing.T) {
	f := newFixture(t)
	var ids []string
	for range 7 {
		ids = append(ids, f.enqueue(t, msg("t"))...)
	}
	got := f.claim(t, "t1", 10, time.Minute)
	row := map[string]int64{}
	for _, m := range got {
		row[m.ID] = m.RowID
	}

	// Fenced: another token changes nothing.
	if marked, err := f.t.Done(ctx, f.Pool, "other", []int64{row[ids[0]]}); err != nil || len(marked) != 0 {
		t.Errorf("done under another token: %v, %v", marked, err)
	}
	for name, mark := range map[string]func() (lifecycle.Mark, error){
		"retry": func() (lifecycle.Mark, error) {
			return f.t.Retry(ctx, f.Pool, "other", row[ids[0]], 5, time.Second, "x")
		},
		"refuse": func() (lifecycle.Mark, error) { return f.t.Refuse(ctx, f.Pool, "other", row[ids[0]], "x") },
		"unreadable": func() (lifecycle.Mark, error) {
			return f.t.Unreadable(ctx, f.Pool, "other", row[ids[0]], errors.New("x"))
		},
		"sink-suspend": func() (lifecycle.Mark, error) { return f.t.SinkSuspend(ctx, f.Pool, "other", row[ids[0]], "x") },
	} {
		if _, err := mark(); !errors.Is(err, lifecycle.ErrNotClaimed) {
			t.Errorf("%s under another token: %v, want ErrNotClaimed", name, err)
		}
	}
	if r := f.row(t, ids[0]); r.state != lifecycle.Claimed || r.attempts != 0 {
		t.Fatalf("fenced marks changed %+v", r)
	}

	if marked, err := f.t.Done(ctx, f.Pool, "t1", []int64{row[ids[0]]}); err != nil || len(marked) != 1 {
		t.Errorf("done: %v, %v", marked, err)
	}
	if r := f.row(t, ids[0]); r.state != lifecycle.Done || r.attempts != 1 || !r.finished || r.token != "" {
		t.Errorf("done: %+v", r)
	}
	if released, err := f.t.Release(ctx, f.Pool, "t1", []int64{row[ids[1]]}); err != nil || len(released) != 1 {
		t.Errorf("release: %v, %v", released, err)
	}
	if r := f.row(t, ids[1]); r.state != lifecycle.Ready || r.attempts != 0 || r.token != "" || r.dueIn > 0 {
		t.Errorf("released: %+v", r)
	}
	m, err := f.t.Retry(ctx, f.Pool, "t1", row[ids[2]], 5, time.Hour, "publish_failed: nak")
	if r := f.row(t, ids[2]); err != nil || m != (lifecycle.Mark{State: lifecycle.RetryWait, Attempts: 1}) ||
		r.state != lifecycle.RetryWait || r.lastError != "publish_failed: nak" || r.dueIn < 59*time.Minute || r.finished {
		t.Errorf("retry: %+v, %v; row %+v", m, err, r)
	}
	m, err = f.t.Retry(ctx, f.Pool, "t1", row[ids[3]], 1, time.Hour, "publish_failed: nak\x00\xff")
	if r := f.row(t, ids[3]); err != nil || m.State != lifecycle.Dead || r.state != lifecycle.Dead || !r.finished ||
		r.lastError != "publish_failed: nak\uFFFD" {
		t.Errorf("retry at the cap: %+v, %v; row %+v", m, err, r)
	}
	m, err = f.t.Refuse(ctx, f.Pool, "t1", row[ids[4]], "refused: invalid subject")
	if r := f.row(t, ids[4]); err != nil || m.State != lifecycle.Dead || r.attempts != 1 || r.lastError != "refused: invalid subject" || !r.finished {
		t.Errorf("refuse: %+v, %v; row %+v", m, err, r)
	}
	m, err = f.t.Unreadable(ctx, f.Pool, "t1", row[ids[5]], errors.New("row 7: column headers is NULL"))
	if r := f.row(t, ids[5]); err != nil || m.State != lifecycle.Dead || r.lastError != "unreadable: row 7: column headers is NULL" || r.attempts != 1 {
		t.Errorf("unreadable: %+v, %v; row %+v", m, err, r)
	}
	m, err = f.t.SinkSuspend(ctx, f.Pool, "t1", row[ids[6]], "budget exhausted")
	if r := f.row(t, ids[6]); err != nil || m.State != lifecycle.Suspended || r.attempts != 0 || r.suspendedReason != "budget exhausted" || r.token != "" {
		t.Errorf("sink-suspend: %+v, %v; row %+v", m, err, r)
	}
	// Long text is cut at a character boundary.
	long := strings.Repeat("é", lifecycle.MaxText)
	if got := lifecycle.Text(long); len(got) > lifecycle.MaxText || !strings.HasPrefix(long, got) {
		t.Errorf("Text cut %d bytes to %d", len(long), len(got))
	}
}

// TestReclaim: a claim that ran out is taken back, its attempt counted:
// waiting for a retry due at once, or dead at the cap, with claim_expired
// naming the relay.
func TestReclaim(t *testing.T) {
	f := newFixture(t)
	ids := append(f.enqueue(t, msg("a")), f.enqueue(t, msg("b"))...)
	keep := f.enqueue(t, msg("c"))
	f.claim(t, "t1", 2, time.Millisecond)
	f.claim(t, "t2", 1, time.Hour)
	f.set(t, ids[1], `attempts = 4`)
	time.Sleep(5 * time.Millisecond) // the claims of a millisecond run out on the server's clock
	got, err := f.t.Reclaim(ctx, f.Pool, 5)
	if err != nil || len(got) != 2 {
		t.Fatalf("reclaim: %+v, %v", got, err)
	}
	byID := map[string]lifecycle.Reclaimed{got[0].ID: got[0], got[1].ID: got[1]}
	if r := byID[ids[0]]; r.State != lifecycle.RetryWait || r.Attempts != 1 || r.Topic != "a" {
		t.Errorf("reclaimed %+v", r)
	}
	if r := byID[ids[1]]; r.State != lifecycle.Dead || r.Attempts != 5 {
		t.Errorf("reclaimed at the cap %+v", r)
	}
	if r := f.row(t, ids[0]); r.state != lifecycle.RetryWait || r.dueIn > 0 || r.token != "" ||
		r.lastError != "claim_expired: the claim of relay-t1 ran out before it marked an outcome" {
		t.Errorf("reclaimed row %+v", r)
	}
	if r := f.row(t, keep[0]); r.state != lifecycle.Claimed {
		t.Errorf("a live claim was taken back: %+v", r)
	}
}

// TestSuspendResume: an operator suspends by topic, ordering key or IDs,
// any message scheduled, ready, waiting or claimed (which loses its token),
// counting no attempt; resume makes them ready and due now, or scheduled
// when their due time is later.
func TestSuspendResume(t *testing.T) {
	f := newFixture(t)
	a := f.enqueue(t, msg("orders"), msg("orders"))
	b := f.enqueue(t, lifecycle.NewMessage{Topic: "orders", NotBefore: time.Now().Add(time.Hour)})
	c := f.enqueue(t, lifecycle.NewMessage{Topic: "payments", OrderingKey: "acct-1"})
	d := f.enqueue(t, msg("payments"))
	f.claim(t, "t1", 10, time.Minute) // a[0], c[0], d[0]
	f.set(t, d[0], `status = 'done', claim_token = NULL, claim_until = NULL, finished_at = clock_timestamp()`)

	if _, err := f.t.Suspend(ctx, f.Pool, lifecycle.Selector{}, "x"); !errors.Is(err, lifecycle.ErrNoSelection) {
		t.Errorf("suspend of nothing selected: %v", err)
	}
	got, err := f.t.Suspend(ctx, f.Pool, lifecycle.Selector{Topic: "orders"}, "orders down")
	if err != nil || len(got) != 3 {
		t.Fatalf("suspend -topic orders: %+v, %v", got, err)
	}
	for _, id := range append(a, b...) {
		if r := f.row(t, id); r.state != lifecycle.Suspended || r.suspendedReason != "orders down" || r.token != "" || r.attempts != 0 {
			t.Errorf("%s suspended: %+v", id, r)
		}
	}
	if _, err := f.t.Done(ctx, f.Pool, "t1", []int64{f.row(t, a[0]).id}); err != nil {
		t.Fatal(err)
	}
	if r := f.row(t, a[0]); r.state != lifecycle.Suspended {
		t.Errorf("the relay's done mark changed a suspended message: %+v", r)
	}
	if got, _ := f.t.Suspend(ctx, f.Pool, lifecycle.Selector{OrderingKey: "acct-1"}, "acct"); len(got) != 1 || got[0].ID != c[0] {
		t.Errorf("suspend -key acct-1: %+v", got)
	}
	if got, _ := f.t.Suspend(ctx, f.Pool, lifecycle.Selector{IDs: d}, "x"); len(got) != 0 {
		t.Errorf("suspend of a done message: %+v", got)
	}

	got, err = f.t.Resume(ctx, f.Pool, lifecycle.Selector{IDs: append(a, b...)})
	if err != nil || len(got) != 3 {
		t.Fatalf("resume: %+v, %v", got, err)
	}
	if r := f.row(t, a[0]); r.state != lifecycle.Ready || r.dueIn > 0 || r.suspendedReason != "" {
		t.Errorf("resumed %+v, want ready and due", r)
	}
	if r := f.row(t, b[0]); r.state != lifecycle.Scheduled || r.dueIn < 59*time.Minute {
		t.Errorf("resumed %+v, want scheduled in an hour", r)
	}
	if got, _ := f.t.Resume(ctx, f.Pool, lifecycle.Selector{All: true}); len(got) != 1 || got[0].ID != c[0] || got[0].State != lifecycle.Ready {
		t.Errorf("resume all: %+v", got)
	}
}

// TestSchedule: scheduled, ready and waiting messages fall due at a time,
// or after a duration from the server's clock; claimed, suspended and
// finished ones are left alone.
func TestSchedule(t *testing.T) {
	f := newFixture(t)
	a := f.enqueue(t, msg("a"))
	b := f.enqueue(t, msg("b"))
	c := f.enqueue(t, msg("c"))
	f.claim(t, "t", 1, time.Minute) // a
	got, err := f.t.Schedule(ctx, f.Pool, append(append(a, b...), c...), lifecycle.When{In: time.Hour})
	if err != nil || len(got) != 2 || got[0].State != lifecycle.Scheduled {
		t.Fatalf("schedule: %+v, %v", got, err)
	}
	if r := f.row(t, b[0]); r.state != lifecycle.Scheduled || r.dueIn < 59*time.Minute || r.dueIn > time.Hour {
		t.Errorf("scheduled %+v", r)
	}
	if r := f.row(t, a[0]); r.state != lifecycle.Claimed {
		t.Errorf("a claimed message was scheduled: %+v", r)
	}
	got, err = f.t.Schedule(ctx, f.Pool, c, lifecycle.When{At: time.Now().Add(-time.Minute)})
	if err != nil || len(got) != 1 || got[0].State != lifecycle.Ready {
		t.Errorf("schedule in the past: %+v, %v, want ready", got, err)
	}
	if r := f.row(t, c[0]); r.dueIn > -59*time.Second {
		t.Errorf("due in %v, want a minute ago", r.dueIn)
	}
	if _, err := f.t.Schedule(ctx, f.Pool, nil, lifecycle.When{}); !errors.Is(err, lifecycle.ErrNoSelection) {
		t.Errorf("schedule of no IDs: %v", err)
	}
}

// TestCancel: any message not finished is canceled, with its reason;
// a claimed one loses its token, so that its relay's marks are refused;
// finished ones are left alone.
func TestCancel(t *testing.T) {
	f := newFixture(t)
	claimed := f.enqueue(t, msg("a"))
	f.claim(t, "t", 1, time.Minute)
	ready := f.enqueue(t, msg("b"))
	done := f.enqueue(t, msg("c"))
	f.set(t, done[0], `status = 'done', finished_at = clock_timestamp()`)
	got, err := f.t.Cancel(ctx, f.Pool, append(append(claimed, ready...), done...), "by test")
	if err != nil || len(got) != 2 {
		t.Fatalf("cancel: %+v, %v", got, err)
	}
	for _, id := range append(claimed, ready...) {
		if r := f.row(t, id); r.state != lifecycle.Canceled || r.lastError != "canceled: by test" || !r.finished || r.token != "" {
			t.Errorf("canceled %+v", r)
		}
	}
	if marked, _ := f.t.Done(ctx, f.Pool, "t", []int64{f.row(t, claimed[0]).id}); len(marked) != 0 {
		t.Error("the relay's done mark changed a canceled message")
	}
	if r := f.row(t, done[0]); r.state != lifecycle.Done {
		t.Errorf("a done message was canceled: %+v", r)
	}
	if _, err := f.t.Cancel(ctx, f.Pool, []string{"nope"}, "x"); !errors.Is(err, lifecycle.ErrInvalidID) {
		t.Errorf("cancel of an invalid ID: %v", err)
	}
}

// TestRequeue: finished messages of the states asked are ready again, due
// now, their attempts reset, the requeue recorded; their last error stays.
func TestRequeue(t *testing.T) {
	f := newFixture(t)
	dead := f.enqueue(t, msg("a"))
	done := f.enqueue(t, msg("a"))
	ready := f.enqueue(t, msg("a"))
	f.set(t, dead[0], `status = 'dead', attempts = 25, last_error = 'publish_failed: x', finished_at = clock_timestamp()`)
	f.set(t, done[0], `status = 'done', attempts = 1, finished_at = clock_timestamp()`)

	got, err := f.t.Requeue(ctx, f.Pool, lifecycle.Selector{Topic: "a"}, []lifecycle.State{lifecycle.Dead}, "ops")
	if err != nil || len(got) != 1 || got[0].ID != dead[0] {
		t.Fatalf("requeue dead: %+v, %v", got, err)
	}
	if r := f.row(t, dead[0]); r.state != lifecycle.Ready || r.attempts != 0 || r.finished || r.requeues != 1 || r.requeuedBy != "ops" ||
		r.lastError != "publish_failed: x" || r.dueIn > 0 {
		t.Errorf("requeued %+v", r)
	}
	if _, err := f.t.Requeue(ctx, f.Pool, lifecycle.Selector{All: true}, []lifecycle.State{lifecycle.Ready}, "ops"); err == nil {
		t.Error("requeue of ready messages: no error")
	}
	got, err = f.t.Requeue(ctx, f.Pool, lifecycle.Selector{IDs: append(done, ready...)}, nil, "ops2")
	if err != nil || len(got) != 1 || got[0].ID != done[0] {
		t.Errorf("requeue by IDs: %+v, %v", got, err)
	}
}

// TestPurge: finished messages past the age are deleted, the oldest first,
// a limit at a time; those not finished never.
func TestPurge(t *testing.T) {
	f := newFixture(t)
	var old []string
	for _, st := range []string{"done", "dead", "canceled"} {
		id := f.enqueue(t, msg("t"))[0]
		f.set(t, id, `status = '`+st+`', finished_at = clock_timestamp() - interval '2 hours'`)
		old = append(old, id)
	}
	young := f.enqueue(t, msg("t"))[0]
	f.set(t, young, `status = 'done', finished_at = clock_timestamp()`)
	open := f.enqueue(t, msg("t"))[0]
	f.set(t, open, `enqueued_at = clock_timestamp() - interval '1 day'`)

	got, err := f.t.Purge(ctx, f.Pool, lifecycle.PurgeFilter{Selector: lifecycle.Selector{All: true}, Older: time.Hour, Limit: 2})
	if err != nil || len(got) != 2 || got[0].ID != old[0] {
		t.Fatalf("purge: %+v, %v", got, err)
	}
	got, err = f.t.Purge(ctx, f.Pool, lifecycle.PurgeFilter{Selector: lifecycle.Selector{All: true}, States: []lifecycle.State{lifecycle.Canceled}, Older: time.Hour, Limit: 10})
	if err != nil || len(got) != 1 || got[0].ID != old[2] {
		t.Errorf("purge canceled: %+v, %v", got, err)
	}
	got, err = f.t.Purge(ctx, f.Pool, lifecycle.PurgeFilter{Selector: lifecycle.Selector{IDs: []string{young, open}}, Limit: 10})
	if err != nil || len(got) != 1 || got[0].ID != young {
		t.Errorf("purge by IDs: %+v, %v", got, err)
	}
	if st := f.Statuses(t); len(st) != 1 || st[lifecycle.Ready] != 1 {
		t.Errorf("left %v, want the ready message alone", st)
	}
	if _, err := f.t.Purge(ctx, f.Pool, lifecycle.PurgeFilter{Selector: lifecycle.Selector{All: true}, States: []lifecycle.State{lifecycle.Ready}, Limit: 1}); err == nil {
		t.Error("purge of ready messages: no error")
	}
}

// TestReads: the relay's state, idemctl's status, a lookup (which locks),
// the states of rows and a list.
func TestReads(t *testing.T) {
	f := newFixture(t)
	a := f.enqueue(t, msg("a"))
	b := f.enqueue(t, msg("b"))
	f.set(t, a[0], `due_at = clock_timestamp() - interval '90 seconds'`)
	f.set(t, b[0], `status = 'dead', last_error = 'refused: ' || storage_key || '/' || seq || ' bad', finished_at = clock_timestamp()`)
	c := f.enqueue(t, lifecycle.NewMessage{Topic: "c", NotBefore: time.Now().Add(time.Minute)})

	st, err := f.t.RelayState(ctx, f.Pool)
	if err != nil || st.Lag < 90*time.Second || st.Lag > 100*time.Second || st.NextDue < 55*time.Second || st.NextExpiry != 0 {
		t.Errorf("relay state %+v, %v", st, err)
	}
	s, err := f.t.Status(ctx, f.Pool, 5)
	if err != nil {
		t.Fatal(err)
	}
	if s.Total != 3 || s.Counts[lifecycle.Ready] != 1 || s.Counts[lifecycle.Dead] != 1 || s.Counts[lifecycle.Scheduled] != 1 ||
		s.Counts[lifecycle.Canceled] != 0 || len(s.Counts) != len(lifecycle.States()) || s.Due[lifecycle.Ready] != 1 || s.Due[lifecycle.Scheduled] != 0 {
		t.Errorf("status %+v", s)
	}
	if s.Oldest == nil || s.Oldest.ID != a[0] {
		t.Errorf("oldest %+v", s.Oldest)
	}
	if g := s.Errors[lifecycle.Dead]; g.Groups != 1 || g.Shown[0].Error != "refused: <id> bad" || g.Shown[0].LatestID != b[0] {
		t.Errorf("dead errors %+v", g)
	}

	found, err := f.t.Lookup(ctx, f.Pool, []string{a[0], c[0], "key-9/1"})
	if err != nil || len(found) != 2 || found[a[0]].State != lifecycle.Ready || found[c[0]].State != lifecycle.Scheduled {
		t.Errorf("lookup %+v, %v", found, err)
	}
	states, err := f.t.States(ctx, f.Pool, []int64{found[a[0]].RowID, 999})
	if err != nil || len(states) != 1 || states[found[a[0]].RowID] != lifecycle.Ready {
		t.Errorf("states %v, %v", states, err)
	}
	listed, err := f.t.List(ctx, f.Pool, lifecycle.Dead, "", 0)
	if err != nil || len(listed) != 1 || listed[0].ID != b[0] || listed[0].FinishedAt == nil {
		t.Errorf("list %+v, %v", listed, err)
	}
}

// TestEdgesOfTheDocumentation: the edges' states are those of the package
// documentation's table, and every state is reachable and left.
func TestEdgesOfTheDocumentation(t *testing.T) {
	to := map[lifecycle.State]bool{}
	from := map[lifecycle.State]bool{}
	for _, e := range lifecycle.Edges() {
		for _, s := range e.To() {
			to[s] = true
		}
		for _, s := range e.From() {
			from[s] = true
			if !s.Valid() {
				t.Errorf("%s: %q is not a state", e.Name(), s)
			}
		}
	}
	for _, s := range lifecycle.States() {
		if !to[s] || !from[s] {
			t.Errorf("%s: reached %v, left %v", s, to[s], from[s])
		}
	}
	for _, e := range []lifecycle.Edge{lifecycle.EdgeExtend, lifecycle.EdgeRelease, lifecycle.EdgeDone, lifecycle.EdgeRetry,
		lifecycle.EdgeRefuse, lifecycle.EdgeUnreadable, lifecycle.EdgeSinkSuspend, lifecycle.EdgeReclaim} {
		if !slices.Equal(e.From(), []lifecycle.State{lifecycle.Claimed}) {
			t.Errorf("%s moves from %v, want claimed only", e.Name(), e.From())
		}
	}
	for _, s := range lifecycle.Terminal() {
		for _, e := range lifecycle.Edges() {
			if e.Allows(s) && e.Name() != "requeue" && e.Name() != "purge" {
				t.Errorf("%s moves a finished message (%s)", e.Name(), s)
			}
		}
	}
}
