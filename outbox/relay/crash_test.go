package relay_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency/internal/faultproxy"
	"github.com/go-idempotency/idempotency/internal/outboxtest"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/outbox/relay"
)

// The environment of the child process TestRelayKilledBetweenPublishAndMark
// starts: the test binary again, which then runs runChild instead of the
// tests.
const (
	childEnv    = "OUTBOX_RELAY_CHILD"
	childURLEnv = "OUTBOX_RELAY_CHILD_URL"
	// childBatchEnv, set to n, makes the child's sink a BatchSink and its
	// batches n messages.
	childBatchEnv = "OUTBOX_RELAY_CHILD_BATCH"
	childLease    = time.Second
)

// runChild is the child process: a relay whose sink confirms every message
// (printing "published <id> <attempt>") and whose first mark-done statement
// (the batch's, once all of it was published) never reaches the server (it
// prints "marking" and blocks), so that the parent can kill it between the
// publishes and the mark. With childBatchEnv, the sink is a BatchSink and
// the relay's pipeline goes on while the mark blocks: it presents the next
// batch, and claims the one after.
func runChild() int {
	cfg, err := pgxpool.ParseConfig(os.Getenv(childURLEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg.ConnConfig.Tracer = blockMarks{}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var sink outbox.Sink = outbox.SinkFunc(func(_ context.Context, e outbox.Envelope) error {
		fmt.Printf("published %s %d\n", e.ID, e.Attempt)
		return nil
	})
	opts := []relay.Option{relay.WithName("child"), relay.WithClaimLease(childLease)}
	if n, err := strconv.Atoi(os.Getenv(childBatchEnv)); err == nil {
		sink = printBatches{}
		opts = append(opts, relay.WithBatchSize(n))
	}
	relay.New(pool, sink, opts...).Run(context.Background())
	return 0
}

// printBatches is the child's BatchSink: it confirms every envelope, each
// printed as "published <id> <attempt>".
type printBatches struct{}

func (printBatches) Publish(_ context.Context, e outbox.Envelope) error {
	fmt.Printf("published %s %d\n", e.ID, e.Attempt)
	return nil
}

func (p printBatches) PublishBatch(ctx context.Context, es []outbox.Envelope) []error {
	errs := make([]error, len(es))
	for i, e := range es {
		errs[i] = p.Publish(ctx, e)
	}
	return errs
}

// batchSink is a Recorder whose PublishBatch publishes each envelope in
// turn.
type batchSink struct {
	*outboxtest.Recorder
	outbox.BatchSink
}

// blockMarks stops the child at its first mark-done statement.
type blockMarks struct{}

func (blockMarks) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, "status = 'done'") {
		fmt.Println("marking")
		select {}
	}
	return ctx
}

func (blockMarks) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestRelayKilledBetweenPublishAndMark: a relay process is killed with
// SIGKILL after its sink confirmed a batch's messages and before it marked
// them done. Once the claim lease has run out, another relay takes the
// batch back (an attempt counted for each message) and publishes it: each
// message the dead relay had published is delivered a second time, with
// the same ID (at least once), and every message ends done.
func TestRelayKilledBetweenPublishAndMark(t *testing.T) {
	db := outboxtest.NewDB(t)
	ids := enqueueRecords(t, db, "k", 3)

	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), childEnv+"=1", childURLEnv+"="+db.URL)
	child.Stderr = os.Stderr
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		child.Process.Kill()
		child.Wait()
	})
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var published []string
	timeout := time.After(30 * time.Second)
wait:
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("the child ended before its mark")
			}
			if l == "marking" {
				break wait
			}
			published = append(published, l)
		case <-timeout:
			t.Fatal("the child did not reach its mark within 30s")
		}
	}
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	child.Wait()
	if len(published) != len(ids) {
		t.Fatalf("the child published %q before its mark, want the batch of %d", published, len(ids))
	}
	for _, l := range published {
		var id string
		var attempt int
		if _, err := fmt.Sscanf(l, "published %s %d", &id, &attempt); err != nil || attempt != 1 {
			t.Fatalf("child's line %q", l)
		}
		if row, _ := db.Row(t, id); row.Status != lifecycle.Claimed {
			t.Fatalf("published message %s is %s after the kill, want claimed", id, row.Status)
		}
	}

	rec := outboxtest.NewRecorder()
	ev := start(t, db.Pool, rec, relay.WithName("survivor"))
	if err := rec.AwaitIDs(15*time.Second, ids...); err != nil {
		t.Fatal(err)
	}
	republished := time.Since(killed)
	if republished < childLease/2 {
		t.Errorf("published again %v after the kill, before the claim lease (%v) could run out", republished, childLease)
	}
	for _, d := range rec.Deliveries() {
		if d.Attempt != 2 {
			t.Errorf("%s presented at attempt %d, want 2 (the dead claim counted)", d.ID, d.Attempt)
		}
	}
	rec.ExpectOnceEach(t, ids) // by the survivor; the child had delivered each once more
	ev.Await(t, 5*time.Second, "3 reclaimed, 3 published", func() bool {
		return len(ev.Of(relay.EventReclaimed)) == 3 && len(ev.Of(relay.EventPublished)) == 3
	})
	for _, id := range ids {
		if row, _ := db.Row(t, id); row.Status != lifecycle.Done || row.Attempts != 2 {
			t.Errorf("%s: %+v, want done after 2 attempts", id, row)
		}
	}
	t.Logf("%d messages delivered by the killed relay and again %v after the kill by the survivor", len(ids), republished.Round(time.Millisecond))
	reliability.Report(t, reliability.Result{Scenario: "outbox: relay SIGKILLed between publish and mark-done", Store: "postgres",
		Operations: 4, Faults: 1, Note: fmt.Sprintf("claim lease 1s: the batch taken back and published %v after the kill, attempt 2; its 3 published messages delivered twice with the same IDs (at least once), all 3 done", republished.Round(10*time.Millisecond))})
}

// TestPipelinedRelayKilledBetweenPublishAndMark: a relay whose sink takes
// batches (of 5) is killed with SIGKILL while its pipeline is full: the
// first batch published and its done mark on its way, the second
// published, waiting for its turn to be marked, the third claimed and
// waiting for the sink. Once the claim lease has run out, another relay
// takes the three batches back (an attempt counted for each message) and
// publishes them: the ten messages the dead relay had published are
// delivered a second time, with the same IDs (at least once), the five it
// had only claimed once; none is lost, and every message ends done.
func TestPipelinedRelayKilledBetweenPublishAndMark(t *testing.T) {
	db := outboxtest.NewDB(t)
	ids := enqueueRecords(t, db, "k", 20)

	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), childEnv+"=1", childURLEnv+"="+db.URL, childBatchEnv+"=5")
	child.Stderr = os.Stderr
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		child.Process.Kill()
		child.Wait()
	})
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	published := map[string]bool{}
	marking := false
	timeout := time.After(30 * time.Second)
	for !marking || len(published) < 10 {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("the child ended before its mark")
			}
			if l == "marking" {
				marking = true
				continue
			}
			var id string
			var attempt int
			if _, err := fmt.Sscanf(l, "published %s %d", &id, &attempt); err != nil || attempt != 1 || published[id] {
				t.Fatalf("child's line %q", l)
			}
			published[id] = true
		case <-timeout:
			t.Fatalf("the child did not publish two batches and reach its first mark within 30s (%d published)", len(published))
		}
	}
	// The third batch is claimed, waiting for the sink.
	deadline := time.Now().Add(10 * time.Second)
	for db.Statuses(t)[lifecycle.Claimed] < 15 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	child.Wait()
	if len(published) != 10 {
		t.Fatalf("the child published %d messages, want its first two batches (10)", len(published))
	}
	var claimedOnly []string
	for _, id := range ids {
		row, _ := db.Row(t, id)
		switch {
		case published[id] && row.Status != lifecycle.Claimed:
			t.Fatalf("published message %s is %s after the kill, want claimed", id, row.Status)
		case !published[id] && row.Status == lifecycle.Claimed:
			claimedOnly = append(claimedOnly, id)
		}
	}
	if len(claimedOnly) != 5 {
		t.Fatalf("%d messages claimed and not published by the child, want its third batch (5)", len(claimedOnly))
	}

	rec := outboxtest.NewRecorder()
	// A BatchSink, as the child's: the survivor presents whole batches.
	ev := start(t, db.Pool, batchSink{rec, outbox.AsBatchSink(rec, 1)}, relay.WithName("survivor"))
	if err := rec.AwaitIDs(15*time.Second, ids...); err != nil {
		t.Fatal(err)
	}
	republished := time.Since(killed)
	if republished < childLease/2 {
		t.Errorf("published again %v after the kill, before the claim lease (%v) could run out", republished, childLease)
	}
	rec.ExpectOnceEach(t, ids) // by the survivor; the child had delivered ten of them once more
	for _, d := range rec.Deliveries() {
		want := 1
		if published[d.ID] || slices.Contains(claimedOnly, d.ID) {
			want = 2 // the dead relay's claim counted
		}
		if d.Attempt != want {
			t.Errorf("%s presented at attempt %d, want %d", d.ID, d.Attempt, want)
		}
	}
	ev.Await(t, 5*time.Second, "15 reclaimed, 20 published", func() bool {
		return len(ev.Of(relay.EventReclaimed)) == 15 && len(ev.Of(relay.EventPublished)) == 20
	})
	db.AwaitAllDone(t, 5*time.Second)
	reliability.Report(t, reliability.Result{Scenario: "outbox: pipelined relay SIGKILLed with a batch published, one published and waiting for its mark, one claimed", Store: "postgres",
		Operations: int64(len(ids)), Faults: 1, Note: fmt.Sprintf("batches of 5, claim lease 1s: the 15 messages of the 3 batches in flight taken back and published %v after the kill, attempt 2; the 10 the dead relay had published delivered twice with the same IDs (at least once), the 5 it had only claimed once; none lost, all 20 done", republished.Round(10*time.Millisecond))})
}

// TestConnectionKilledDuringClaim: the relay's backend is terminated while
// its claim statement runs (waiting on a lock the test holds): the claim
// rolls back, the relay reports the error, reconnects, and delivers every
// message once; nothing is left claimed.
func TestConnectionKilledDuringClaim(t *testing.T) {
	db := outboxtest.NewDB(t)
	ids := enqueueRecords(t, db, "k", 20)
	lock, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx)
	if _, err := lock.Exec(ctx, `LOCK TABLE idempotency_outbox IN EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	rec := outboxtest.NewRecorder()
	ev := start(t, newPool(t, db.URL), rec, relay.WithPollInterval(50*time.Millisecond))
	// The relay's statements wait on the lock one after the other (the
	// claim follows the reclaim): kill each until the claim is killed.
	kills := 0
	for claim := false; !claim; kills++ {
		var pid uint32
		pid, claim = waitingStatement(t, db)
		pgtest.Terminate(t, db.Pool, pid)
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rec.AwaitIDs(15*time.Second, ids...); err != nil {
		t.Fatal(err)
	}
	rec.ExpectOnceEach(t, ids)
	if len(ev.Of(relay.EventError)) == 0 {
		t.Error("the killed claim was not reported")
	}
	db.AwaitAllDone(t, 5*time.Second)
	reliability.Report(t, reliability.Result{Scenario: "outbox: relay's backend killed during its claim", Store: "postgres",
		Operations: int64(len(ids)), Faults: int64(kills), Note: fmt.Sprintf("%d backends killed while waiting (the last in its claim); the claim rolled back, the relay reconnected; 20 of 20 delivered once, none left claimed", kills)})
}

// waitingStatement returns the backend whose statement on the outbox waits
// on a lock, and whether that statement is the claim, polling
// pg_stat_activity (the server's view) for at most 10s.
func waitingStatement(t *testing.T, db *outboxtest.DB) (uint32, bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var pid int32
		var query string
		err := db.Pool.QueryRow(ctx, `SELECT pid, query FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%idempotency_outbox%'`).Scan(&pid, &query)
		if err == nil {
			return uint32(pid), strings.Contains(query, "claim_token = $2")
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("no statement of the relay waited on the lock within 10s")
	return 0, false
}

// TestClaimReplyLost: the claim commits but its reply never reaches the
// relay (the connection is cut after the server answered). The claimed
// messages are nobody's; once the lease has run out they are taken back
// (attempt 2) and delivered once each; nothing is lost or left claimed.
func TestClaimReplyLost(t *testing.T) {
	db := outboxtest.NewDB(t)
	ids := enqueueRecords(t, db, "k", 10)
	var proxy *faultproxy.Proxy
	pool := newPool(t, db.URL, func(c *pgxpool.Config) {
		proxy, c.ConnConfig = pgtest.Proxy(t, c.ConnConfig)
		// The statement's text on the wire every time, for the trigger.
		c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	})
	cut := proxy.CutOn([]byte("claim_token = $2::text, claimed_by"), faultproxy.CutAfterReply)
	rec := outboxtest.NewRecorder()
	direct, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	ev := start(t, pool, rec, relay.WithClaimLease(500*time.Millisecond), relay.WithPollInterval(50*time.Millisecond), relay.WithListenerConfig(direct))
	select {
	case <-cut:
	case <-time.After(10 * time.Second):
		t.Fatal("the claim never ran")
	}
	if st := db.Statuses(t); st[lifecycle.Claimed] != len(ids) {
		t.Fatalf("after the lost reply: %v, want %d claimed", st, len(ids))
	}
	proxy.Restore()
	if err := rec.AwaitIDs(15*time.Second, ids...); err != nil {
		t.Fatal(err)
	}
	rec.ExpectOnceEach(t, ids)
	for _, d := range rec.Deliveries() {
		if d.Attempt != 2 {
			t.Errorf("%s at attempt %d, want 2", d.ID, d.Attempt)
		}
	}
	ev.Await(t, 5*time.Second, "10 reclaimed", func() bool { return len(ev.Of(relay.EventReclaimed)) == len(ids) })
	db.AwaitAllDone(t, 5*time.Second)
	reliability.Report(t, reliability.Result{Scenario: "outbox: claim committed, its reply lost", Store: "postgres",
		Operations: int64(len(ids)), Faults: 1, Note: "10 messages claimed by nobody, taken back after the 500ms lease, delivered once each at attempt 2"})
}
