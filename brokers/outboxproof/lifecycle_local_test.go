package outboxproof_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/childproc"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/outbox/local"
	"github.com/go-idempotency/idempotency/outbox/relay"
	"github.com/go-idempotency/idempotency/pgstore"
)

// failFirstHeader, on a message of the local-run proof, makes the first
// attempt of its work fail after its write.
const failFirstHeader = "Proof-Fail-First"

// lcLocalEnv, set, makes a process a relay of the local-run proof.
const lcLocalEnv = "OUTBOXPROOF_LOCAL_RELAY"

// TestLocalRunsExactlyOnce: three relay processes run each message's work
// as a local run (outbox/local): the work inserts an effect row in the
// run's transaction, with which the local sink takes the message's done
// edge, fenced by the claim. Relay processes are killed with SIGKILL in
// the middle of the work (the effect written, not committed), again and
// again, each replaced by a new one, and a tenth of the messages fail
// their first attempt after their write. At the end every message is
// done, and the effects table holds exactly one row per message: none
// lost, none twice.
func TestLocalRunsExactlyOnce(t *testing.T) {
	n, kills, deadline := 300, 8, 2*time.Minute
	if os.Getenv(longEnv) == "1" {
		n, kills, deadline = 3000, 40, 5*time.Minute
	}
	r := newRig(t, relayConfig{processes: 3, lease: 2 * time.Second, poll: 200 * time.Millisecond})
	ctx := context.Background()
	// No unique index: a second run's row would be there to count.
	if _, err := r.pool.Exec(ctx, `CREATE TABLE effects (message_id text NOT NULL, payload text NOT NULL, relay text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	want := r.enqueueMany("work-", n, 10, func(i int) outbox.Message {
		m := outbox.Message{Payload: fmt.Appendf(nil, "work-%d", i), OrderingKey: fmt.Sprint("work-", i)}
		if i%10 == 0 {
			m.Headers = map[string]string{failFirstHeader: "1"}
		}
		return m
	})

	// The relays started while kills remain hang in the middle of the
	// work of one of their first runs, each at another.
	started := 0
	start := func() {
		hangAt := 0
		if started < kills {
			hangAt = 1 + started*7%15
		}
		started++
		r.startRelay("TestLocalRunRelayProcess", lcLocalEnv+"=1", childHangAt+"="+strconv.Itoa(hangAt))
	}
	for range 3 {
		start()
	}
	killed, seen := 0, 0
	tick := time.NewTicker(100 * time.Millisecond) // the table's state has no notification
	defer tick.Stop()
	timeout := time.After(deadline)
	for {
		r.pull()
		for ; seen < len(r.lines); seen++ {
			if l := r.lines[seen]; l.Kind == "HANG" {
				l.From.Kill()
				killed++
				start()
			}
		}
		if killed == kills && drained(t, r.pool) {
			break
		}
		select {
		case <-r.log.Notify:
		case <-tick.C:
		case <-timeout:
			t.Fatalf("%d of %d relays killed, and the outbox not drained within %v: %s", killed, kills, deadline, outboxState(t, r.pool))
		}
	}
	r.stopRelays()

	rows := r.rows()
	effects := map[string]int{}
	q, err := r.pool.Query(ctx, `SELECT message_id, payload FROM effects`)
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for q.Next() {
		var id, payload string
		if err := q.Scan(&id, &payload); err != nil {
			t.Fatal(err)
		}
		total++
		effects[id]++
		if want[id] != payload {
			t.Errorf("effect of %s: payload %q, enqueued %q", id, payload, want[id])
		}
	}
	if err := q.Err(); err != nil {
		t.Fatal(err)
	}
	retried := 0
	for id := range want {
		if effects[id] != 1 {
			t.Errorf("%s has %d effect rows, want 1", id, effects[id])
		}
		if w := rows[id]; w.Status != lifecycle.Done {
			t.Errorf("%s is %s (%s)", id, w.Status, w.LastError)
		} else if w.Attempts > 1 {
			retried++
		}
	}
	if total != n || len(effects) != n {
		t.Errorf("%d effect rows of %d messages, for %d messages", total, len(effects), n)
	}
	c := r.lineCounts()
	t.Logf("%d messages run locally by %d relay processes, %d SIGKILLed in the middle of the work: %d effect rows of %d distinct messages; %d runs whose work returned (a run of a killed relay may have returned and not committed), %d first attempts failed after their write; %d messages presented more than once; events: %d reclaimed, %d fenced, %d retried, %d errors",
		n, started, killed, total, len(effects), c["RAN"], c["FAILED"], retried, c["event reclaimed"], c["event fenced"], c["event retried"], c["event error"])
}

// TestLocalRunRelayProcess is a relay process of the local-run proof,
// started by TestLocalRunsExactlyOnce; run by itself it is skipped. It runs
// each message's work (an effect row) as a local run until SIGTERM, and
// reports on stdout READY pid, RAN id attempt for a run whose work
// returned, FAILED id for a first attempt failing on purpose, and the
// relay's events (EVENT kind id state published error). In its
// OUTBOXPROOF_HANG_AT-th run it reports HANG id after the effect row was
// written, and hangs, to be killed.
func TestLocalRunRelayProcess(t *testing.T) {
	if os.Getenv(lcLocalEnv) == "" {
		t.Skip("a relay process of the local-run proof")
	}
	childproc.WatchLifeline()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	lease, err := time.ParseDuration(os.Getenv(lcChildLease))
	if err != nil {
		t.Fatal(err)
	}
	poll, err := time.ParseDuration(os.Getenv(lcChildPoll))
	if err != nil {
		t.Fatal(err)
	}
	hangAt, _ := strconv.ParseInt(os.Getenv(childHangAt), 10, 64)
	name := os.Getenv(childName)
	cfg, err := pgxpool.ParseConfig(os.Getenv(childDB))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = name
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store := pgstore.New(pool)
	defer store.Close()
	// The runs' record lease as short as the claim's, so that a run of a
	// killed relay holds its message's key no longer than its claim.
	runner := idempotency.NewRunner(store, idempotency.WithTransaction(true), idempotency.WithLease(lease))

	out := &childproc.Reporter{Prefix: linePrefix}
	out.Report("READY", "%d", os.Getpid())
	var runs atomic.Int64
	work := func(ctx context.Context, e outbox.Envelope) error {
		tx, ok := pgstore.TxFromContext(ctx)
		if !ok {
			return errors.New("proof: a local run without its transaction")
		}
		if _, err := tx.Exec(ctx, `INSERT INTO effects (message_id, payload, relay) VALUES ($1, $2, $3)`, e.ID, string(e.Payload), name); err != nil {
			return err
		}
		if runs.Add(1) == hangAt {
			out.Report("HANG", "%s", e.ID)
			select {} // the effect written, not committed: killed here
		}
		if e.Headers[failFirstHeader] != "" && e.Attempt == 1 {
			out.Report("FAILED", "%s", e.ID)
			return errors.New("proof: the first attempt fails after its write")
		}
		out.Report("RAN", "%s %d", e.ID, e.Attempt)
		return nil
	}
	rl := relay.New(pool, local.Sink(runner, work),
		relay.WithName(name),
		relay.WithClaimLease(lease),
		relay.WithPollInterval(poll),
		relay.WithBackoff(50*time.Millisecond, time.Second),
		relay.WithConcurrency(4),
		relay.WithBatchSize(50),
		relay.WithObserver(func(_ context.Context, e relay.Event) {
			switch e.Kind {
			case relay.EventReclaimed, relay.EventFenced, relay.EventRetried, relay.EventDead, relay.EventCanceled,
				relay.EventClaimLost, relay.EventRefused, relay.EventSuspended, relay.EventError:
				out.Report("EVENT", "%s %s %s %t %s", e.Kind, e.ID, e.State, e.Published, oneLine(e.Err))
			}
		}))
	if err := rl.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}
