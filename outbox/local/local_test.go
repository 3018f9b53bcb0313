package local_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/outboxtest"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/memstore"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/internal/runclaim"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/outbox/local"
	"github.com/go-idempotency/idempotency/outbox/relay"
)

// bigPool leaves room for the transactions of several local runs at once
// beside the relays' and the store's own statements.
func bigPool(c *pgxpool.Config) { c.MaxConns = 16 }

// table is the default outbox table's edges.
func table(t testing.TB) *lifecycle.Table {
	t.Helper()
	tb, err := outbox.Table(pgstoreOutbox)
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

const pgstoreOutbox = "idempotency_outbox"

// calls counts the runs of each message's function.
type calls struct {
	mu sync.Mutex
	n  map[string]int
}

// next counts a run of id and returns its number, from 1.
func (c *calls) next(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[id]++
	return c.n[id]
}

func (c *calls) of(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

// TestExactlyOnceWithRetriesAndDuplicates: two relays run 30 messages
// through local runs whose function writes an effect row in its
// transaction. A third of the runs fail after their write and a fifth
// panic after it, the first time: their writes roll back with the
// record's and the done mark's, and the retry commits them. Then an
// operator requeues every message: each is presented again, the record
// replays, and the relay marks it done without running it. At the end
// there is one effect row per message, each message done, and no relay
// reported a mark refused or a claim lost.
func TestExactlyOnceWithRetriesAndDuplicates(t *testing.T) {
	db := outboxtest.NewDB(t, bigPool)
	createEffects(t, db)
	var c calls
	sink := local.Sink(db.Runner, func(ctx context.Context, e outbox.Envelope) error {
		n := c.next(e.ID)
		if err := effect(ctx, e, strconv.Itoa(n)); err != nil {
			return err
		}
		i, _ := strconv.Atoi(string(e.Payload))
		switch {
		case n == 1 && i%3 == 0:
			return errors.New("the provider timed out")
		case n == 1 && i%5 == 0:
			panic("the provider's client panicked")
		}
		return nil
	})
	var ids []string
	for r := range 10 {
		msgs := make([]outbox.Message, 3)
		for j := range msgs {
			msgs[j] = outbox.Message{Topic: "work", Payload: []byte(strconv.Itoa(3*r + j))}
		}
		ids = append(ids, db.Enqueue(t, fmt.Sprintf("record-%d", r), msgs...)...)
	}
	opts := []relay.Option{relay.WithConcurrency(3), relay.WithBatchSize(5), relay.WithClaimLease(2 * time.Second)}
	evA := start(t, db.Pool, sink, append(opts, relay.WithName("a"))...)
	evB := start(t, pgtest.PoolOn(t, db.URL, bigPool), sink, append(opts, relay.WithName("b"))...)
	published := func() int { return len(evA.Of(relay.EventPublished)) + len(evB.Of(relay.EventPublished)) }
	evA.Await(t, 30*time.Second, "30 published", func() bool { return published() >= 30 })

	failing := func(i int) bool { return i%3 == 0 || i%5 == 0 }
	check := func(stage string, wantAttempts func(i int) int) {
		t.Helper()
		got := effects(t, db)
		for i, id := range ids {
			want := "1"
			if failing(i) {
				want = "2"
			}
			if runs := got[id]; !slices.Equal(runs, []string{want}) {
				t.Errorf("%s: effects of %s (%d): %v, want the one of run %s", stage, id, i, runs, want)
			}
			if row, _ := db.Row(t, id); row.Status != lifecycle.Done || row.Attempts != wantAttempts(i) {
				t.Errorf("%s: row %s (%d): %+v, want done at attempt %d", stage, id, i, row, wantAttempts(i))
			}
		}
		if len(got) != len(ids) {
			t.Errorf("%s: effects of %d messages, want %d", stage, len(got), len(ids))
		}
	}
	check("first runs", func(i int) int {
		if failing(i) {
			return 2
		}
		return 1
	})
	var retried []relay.Event
	for _, ev := range []*events{evA, evB} {
		retried = append(retried, ev.Of(relay.EventRetried)...)
	}
	panicked := 0
	for _, e := range retried {
		if strings.Contains(e.Err.Error(), "the provider's client panicked") {
			panicked++
		}
	}
	if len(retried) != 14 || panicked != 4 {
		t.Errorf("%d retries (%d panics), want 14 (4): %+v", len(retried), panicked, retried)
	}

	requeued, err := table(t).Requeue(ctx, lifecycle.Pgx(db.Pool), lifecycle.Selector{All: true}, nil, "test")
	if err != nil || len(requeued) != len(ids) {
		t.Fatalf("requeue: %d, %v", len(requeued), err)
	}
	evA.Await(t, 30*time.Second, "60 published", func() bool { return published() >= 60 })
	check("requeued", func(int) int { return 1 })
	for i, id := range ids {
		want := 1
		if failing(i) {
			want = 2
		}
		if n := c.of(id); n != want {
			t.Errorf("%s ran %d times, want %d", id, n, want)
		}
	}
	noNoise(t, evA)
	noNoise(t, evB)
	reliability.Report(t, reliability.Result{Scenario: "outbox: local runs, exactly once", Store: "postgres",
		Operations: 60, Faults: 14 + 30,
		Note: "30 local runs over two relays, 10 failing and 4 panicking after their write the first time, then all 30 requeued: 30 effect rows, each message done, requeues replayed without a run, no mark refused"})
}

// createEffects creates the effects table in db.
func createEffects(t testing.TB, db *outboxtest.DB) {
	t.Helper()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE effects (id bigserial PRIMARY KEY, message_id text NOT NULL, run text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
}

// TestOneAtATimePerAccount: a queue "one at a time per account": 3
// accounts of 20 messages each, ordering key the account, enqueued while
// two relays of four workers each run them. The function checks that it
// sees each account's messages in order and never two at once, and fails
// the first run of every fourth message (retried in place: the account's
// next messages wait for it).
func TestOneAtATimePerAccount(t *testing.T) {
	db := outboxtest.NewDB(t, bigPool)
	createEffects(t, db)
	const accounts, perAccount = 3, 20
	var (
		mu         sync.Mutex
		next       = map[string]int{}
		running    = map[string]int{}
		violations []string
		c          calls
	)
	sink := local.Sink(db.Runner, func(ctx context.Context, e outbox.Envelope) error {
		seq, _ := strconv.Atoi(string(e.Payload))
		mu.Lock()
		if running[e.OrderingKey] > 0 {
			violations = append(violations, fmt.Sprintf("%s/%d while another message of the account runs", e.OrderingKey, seq))
		}
		if want := next[e.OrderingKey] + 1; seq != want {
			violations = append(violations, fmt.Sprintf("%s/%d when %d was due", e.OrderingKey, seq, want))
		}
		running[e.OrderingKey]++
		mu.Unlock()
		defer func() {
			mu.Lock()
			running[e.OrderingKey]--
			mu.Unlock()
		}()
		time.Sleep(time.Millisecond) // a little work, so that overlaps would show
		if c.next(e.ID) == 1 && seq%4 == 0 {
			return errors.New("the account is busy")
		}
		if err := effect(ctx, e, strconv.Itoa(seq)); err != nil {
			return err
		}
		mu.Lock()
		next[e.OrderingKey] = seq
		mu.Unlock()
		return nil
	})
	opts := []relay.Option{relay.WithConcurrency(4), relay.WithBatchSize(10)}
	evA := start(t, db.Pool, sink, append(opts, relay.WithName("a"))...)
	evB := start(t, pgtest.PoolOn(t, db.URL, bigPool), sink, append(opts, relay.WithName("b"))...)

	var wg sync.WaitGroup
	for a := range accounts {
		account := fmt.Sprintf("account-%d", a)
		wg.Go(func() {
			for seq := 1; seq <= perAccount; seq++ {
				msg := outbox.Message{Topic: "ledger.apply", OrderingKey: account, Payload: []byte(strconv.Itoa(seq))}
				if _, err := db.TryEnqueue(ctx, fmt.Sprintf("%s-%d", account, seq), msg); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	published := func() int { return len(evA.Of(relay.EventPublished)) + len(evB.Of(relay.EventPublished)) }
	evA.Await(t, 60*time.Second, "60 published", func() bool { return published() >= accounts*perAccount })

	mu.Lock()
	defer mu.Unlock()
	for _, v := range violations {
		t.Error(v)
	}
	rows, err := db.Pool.Query(ctx, `SELECT o.ordering_key, e.run FROM effects e
		JOIN idempotency_outbox o ON o.storage_key || '/' || o.seq = e.message_id ORDER BY e.id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	applied := map[string][]string{}
	for rows.Next() {
		var account, seq string
		if err := rows.Scan(&account, &seq); err != nil {
			t.Fatal(err)
		}
		applied[account] = append(applied[account], seq)
	}
	for a := range accounts {
		account := fmt.Sprintf("account-%d", a)
		var want []string
		for seq := 1; seq <= perAccount; seq++ {
			want = append(want, strconv.Itoa(seq))
		}
		if !slices.Equal(applied[account], want) {
			t.Errorf("%s applied %v, want %v", account, applied[account], want)
		}
	}
	if n := len(evA.Of(relay.EventRetried)) + len(evB.Of(relay.EventRetried)); n != accounts*perAccount/4 {
		t.Errorf("%d retries, want %d", n, accounts*perAccount/4)
	}
	noNoise(t, evA)
	noNoise(t, evB)
}

// TestClaimTakenBackWhileRunning: a relay stalls (neither extends its
// claim nor cancels its run) while its local run works, past its claim
// lease; another relay takes the message back and presents it. Its run
// waits for the stale run's call, which holds the message's key. The
// stale run's done mark, once it goes on, changes nothing: its
// transaction rolls back, its effect with it, and it reports the claim
// lost. The second run then commits, once.
func TestClaimTakenBackWhileRunning(t *testing.T) {
	db := outboxtest.NewDB(t, bigPool)
	createEffects(t, db)
	id := db.Enqueue(t, "capture", outbox.Message{Topic: "payments.capture"})[0]

	// The stalled relay: a claim of 300ms taken by hand, and a run with a
	// context no relay cancels.
	const lease = 300 * time.Millisecond
	tb := table(t)
	claimed, err := tb.Claim(ctx, lifecycle.Pgx(db.Pool), "stalled-token", "stalled", lease, 1)
	if err != nil || len(claimed) != 1 || claimed[0].ID != id {
		t.Fatalf("claim: %+v, %v", claimed, err)
	}
	m := claimed[0]
	stale := runclaim.With(ctx, func(string) (runclaim.Claim, bool) {
		return runclaim.Claim{Table: tb, Token: "stalled-token", RowID: m.RowID, Marking: func() {}}, true
	})
	started, release := make(chan struct{}), make(chan struct{})
	staleSink := local.Sink(db.Runner, func(ctx context.Context, e outbox.Envelope) error {
		if err := effect(ctx, e, "stale"); err != nil {
			return err
		}
		close(started)
		<-release // stalled, whatever its context says
		return nil
	})
	staleErr := make(chan error, 1)
	go func() {
		staleErr <- staleSink.Publish(stale, outbox.Envelope{ID: m.ID, Topic: m.Topic, Payload: m.Payload, OrderingKey: m.OrderingKey, Attempt: 1})
	}()
	<-started

	var secondRuns calls
	ev := start(t, db.Pool, local.Sink(db.Runner, func(ctx context.Context, e outbox.Envelope) error {
		secondRuns.next(e.ID)
		return effect(ctx, e, "second")
	}), relay.WithName("b"), relay.WithClaimLease(5*time.Second), relay.WithPollInterval(20*time.Millisecond))
	ev.Await(t, 10*time.Second, "taken back and claimed again", func() bool {
		return len(ev.Of(relay.EventReclaimed)) == 1 && len(ev.Of(relay.EventClaimed)) == 1
	})
	if row, _ := db.Row(t, id); row.Status != lifecycle.Claimed || deref(row.ClaimedBy) != "b" {
		t.Fatalf("after the takeover: %+v, want claimed by b", row)
	}
	if n := secondRuns.of(id); n != 0 {
		t.Fatalf("the second run ran while the stale one held the key (%d)", n)
	}
	close(release)
	select {
	case err := <-staleErr:
		if !errors.Is(err, outbox.ErrClaimLost) {
			t.Errorf("the stale run returned %v, want an error wrapping ErrClaimLost", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stale run did not return")
	}
	ev.Await(t, 10*time.Second, "the second run published", func() bool { return len(ev.Of(relay.EventPublished)) == 1 })
	if got := effects(t, db); !slices.Equal(got[id], []string{"second"}) || len(got) != 1 {
		t.Errorf("effects %v, want the second run's alone", got)
	}
	if row, _ := db.Row(t, id); row.Status != lifecycle.Done || row.Attempts != 2 {
		t.Errorf("row %+v, want done at attempt 2 (the claim that ran out counts one)", row)
	}
	if n := secondRuns.of(id); n != 1 {
		t.Errorf("the second relay ran the message %d times, want 1", n)
	}
	noNoise(t, ev)
	reliability.Report(t, reliability.Result{Scenario: "outbox: a local run's claim taken back", Store: "postgres",
		Operations: 2, Faults: 1,
		Note: "a relay stalled 1 lease past its claim while its run worked: the run's done mark was refused and its effect rolled back; the relay that took the message over waited for the stale run's key and committed once"})
}

// TestCancelWhileRunning: a message canceled (outbox.Cancel, in a
// transactional call) while its local run works has the run's context
// cancelled with a cause wrapping ErrClaimLost; the run's effect rolls
// back, and the message stays canceled.
func TestCancelWhileRunning(t *testing.T) {
	db := outboxtest.NewDB(t, bigPool)
	createEffects(t, db)
	const lease = 600 * time.Millisecond
	id := db.Enqueue(t, "capture", outbox.Message{Topic: "payments.capture"})[0]
	started, cause := make(chan struct{}), make(chan error, 1)
	ev := start(t, db.Pool, local.Sink(db.Runner, func(ctx context.Context, e outbox.Envelope) error {
		if err := effect(ctx, e, "canceled"); err != nil {
			return err
		}
		close(started)
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return context.Cause(ctx)
	}), relay.WithClaimLease(lease))
	<-started
	at := time.Now()
	_, err := idempotency.Do(ctx, db.Runner, idempotency.Call{Name: "refund", Key: "refund-1"}, func(ctx context.Context) ([]string, error) {
		return outbox.Cancel(ctx, id)
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-cause:
		if !errors.Is(err, outbox.ErrClaimLost) {
			t.Errorf("the run's context ended with %v, want a cause wrapping ErrClaimLost", err)
		}
		if took := time.Since(at); took > lease {
			t.Errorf("the run's context was cancelled %v after the cancel, over a lease", took)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the run's context was not cancelled")
	}
	ev.Await(t, 5*time.Second, "canceled", func() bool { return len(ev.Of(relay.EventCanceled)) == 1 })
	if got := effects(t, db); len(got) != 0 {
		t.Errorf("effects %v, want none", got)
	}
	row, _ := db.Row(t, id)
	if row.Status != lifecycle.Canceled || deref(row.LastError) != "canceled: by outbox.Cancel" {
		t.Errorf("row %+v (%q), want canceled by outbox.Cancel", row, deref(row.LastError))
	}
	if n := len(ev.Of(relay.EventPublished)) + len(ev.Of(relay.EventRetried)) + len(ev.Of(relay.EventFenced)); n != 0 {
		t.Errorf("%d published, retried or fenced events, want none", n)
	}
}

// TestErrorsSettle: the function's error is a retry (attempts counted,
// dead at the cap), outbox.Permanent makes the message dead at once,
// outbox.Suspend suspends it without counting the attempt, and a panic is
// a retry with the panic as its error; none leaves its effect behind.
func TestErrorsSettle(t *testing.T) {
	db := outboxtest.NewDB(t, bigPool)
	createEffects(t, db)
	var c calls
	sink := local.Sink(db.Runner, func(ctx context.Context, e outbox.Envelope) error {
		n := c.next(e.ID)
		if err := effect(ctx, e, strconv.Itoa(n)); err != nil {
			return err
		}
		switch string(e.Payload) {
		case "flaky":
			if n < 3 {
				return fmt.Errorf("flaky %d", n)
			}
		case "broken":
			return errors.New("always broken")
		case "refused":
			return outbox.Permanent(errors.New("unknown account"))
		case "suspended":
			return outbox.Suspend("the provider's budget is exhausted")
		case "panics":
			if n == 1 {
				panic("boom")
			}
		}
		return nil
	})
	var ids []string
	for _, p := range []string{"flaky", "broken", "refused", "suspended", "panics"} {
		ids = append(ids, db.Enqueue(t, p, outbox.Message{Topic: "work", Payload: []byte(p)})[0])
	}
	flaky, broken, refused, suspended, panics := ids[0], ids[1], ids[2], ids[3], ids[4]
	ev := start(t, db.Pool, sink, relay.WithMaxAttempts(4))
	ev.Await(t, 20*time.Second, "every message settled", func() bool {
		return len(ev.Of(relay.EventPublished)) == 2 && len(ev.Of(relay.EventDead)) == 1 &&
			len(ev.Of(relay.EventRefused)) == 1 && len(ev.Of(relay.EventSuspended)) == 1
	})
	want := map[string]struct {
		status   lifecycle.State
		attempts int
		lastErr  string
		effects  []string
	}{
		flaky:     {lifecycle.Done, 3, "publish_failed: flaky 2", []string{"3"}},
		broken:    {lifecycle.Dead, 4, "publish_failed: always broken", nil},
		refused:   {lifecycle.Dead, 1, "refused: unknown account", nil},
		suspended: {lifecycle.Suspended, 0, "", nil},
		panics:    {lifecycle.Done, 2, "sink_panicked: the sink panicked: boom", []string{"2"}},
	}
	got := effects(t, db)
	for id, w := range want {
		row, _ := db.Row(t, id)
		if row.Status != w.status || row.Attempts != w.attempts || deref(row.LastError) != w.lastErr {
			t.Errorf("%s: %+v (%q), want %s at %d attempts with %q", id, row, deref(row.LastError), w.status, w.attempts, w.lastErr)
		}
		if !slices.Equal(got[id], w.effects) {
			t.Errorf("%s: effects %v, want %v", id, got[id], w.effects)
		}
	}
	var reason string
	if err := db.Pool.QueryRow(ctx, `SELECT suspended_reason FROM idempotency_outbox WHERE storage_key || '/' || seq = $1`, suspended).Scan(&reason); err != nil || reason != "the provider's budget is exhausted" {
		t.Errorf("suspended reason %q, %v", reason, err)
	}
	if s := ev.Of(relay.EventSuspended); s[0].ID != suspended || s[0].Reason != "the provider's budget is exhausted" {
		t.Errorf("suspended event %+v", s[0])
	}
	if r := ev.Of(relay.EventRefused); r[0].ID != refused || !errors.Is(r[0].Err, outbox.ErrPermanent) {
		t.Errorf("refused event %+v", r[0])
	}
	noNoise(t, ev)
}

// TestWithoutTransactionSuspends: a Runner without a transaction never
// runs the function: the message is suspended with the reason, its
// attempt not counted, for an operator to resume once it is fixed.
func TestWithoutTransactionSuspends(t *testing.T) {
	db := outboxtest.NewDB(t)
	id := db.Enqueue(t, "k", outbox.Message{Topic: "work"})[0]
	var ran atomic.Bool
	ev := start(t, db.Pool, local.Sink(idempotency.NewRunner(db.Store), func(context.Context, outbox.Envelope) error {
		ran.Store(true)
		return nil
	}))
	ev.Await(t, 10*time.Second, "suspended", func() bool { return len(ev.Of(relay.EventSuspended)) == 1 })
	if s := ev.Of(relay.EventSuspended)[0]; s.ID != id || !strings.Contains(s.Reason, "WithTransaction(true)") {
		t.Errorf("suspended %+v", s)
	}
	if row, _ := db.Row(t, id); row.Status != lifecycle.Suspended || row.Attempts != 0 || ran.Load() {
		t.Errorf("row %+v, ran %v: want suspended at 0 attempts, not run", row, ran.Load())
	}
}

// TestWithoutClaimSuspends: a sink called without a relay's claim on the
// message (not by a relay, or by one that forgot to pass it) cannot fence
// its done mark: it asks for a suspension, and the function does not run.
func TestWithoutClaimSuspends(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	ran := false
	sink := local.Sink(idempotency.NewRunner(store), func(context.Context, outbox.Envelope) error {
		ran = true
		return nil
	})
	err := sink.Publish(ctx, outbox.Envelope{ID: "k/1", Topic: "work"})
	if !errors.Is(err, outbox.ErrSuspend) || ran {
		t.Errorf("Publish: %v (ran %v), want a suspension and no run", err, ran)
	}
}
