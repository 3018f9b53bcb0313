package outboxproof_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/childproc"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/outbox/relay"
	"github.com/go-idempotency/idempotency/pgstore"
)

// The proof: producers commit payments, each with one message enqueued in
// its transaction (and calls that roll back after enqueueing), while three
// relay processes publish the outbox through a broker's sink, and a fault
// strikes: a relay killed with SIGKILL after the broker confirmed a
// message and before it marked it done, the broker stopped, or the relays'
// PostgreSQL connections killed in the middle of a claim. Afterwards every
// committed message is in the broker (exactly once in JetStream, at least
// once in RabbitMQ), and none of a rolled-back call.

// longEnv, set to 1, runs the proofs on more messages, with more kills and
// a 30s broker outage.
const longEnv = "IDEMPOTENCY_OUTBOX_LONG"

// linePrefix starts every line a child process reports on its stdout.
const linePrefix = "outboxproof "

// size is the size of a proof run.
type size struct {
	keys       int           // committed keys: a payment and a message each, every key called twice
	rolledBack int           // keys whose every call enqueues and then rolls back
	producers  int           // goroutines committing
	loadFor    time.Duration // how long the producers take, about
	relays     int           // relay processes at once
	kills      int           // relays killed between the broker's confirm and the mark
	pgKills    int           // rounds that kill the relay connections waiting in a claim
	outage     time.Duration // how long the broker is stopped
	deadline   time.Duration // for the outbox to drain after the load
}

func sizeOf() size {
	if os.Getenv(longEnv) == "1" {
		return size{keys: 5000, rolledBack: 500, producers: 8, loadFor: 60 * time.Second, relays: 3, kills: 10, pgKills: 20, outage: 30 * time.Second, deadline: 5 * time.Minute}
	}
	return size{keys: 400, rolledBack: 40, producers: 4, loadFor: 4 * time.Second, relays: 3, kills: 3, pgKills: 4, outage: 3 * time.Second, deadline: time.Minute}
}

// The relays' settings: short, so that a killed relay's claims come back
// soon. The stream's Duplicates window (2 minutes) covers
// natsink.WindowNeeded(2s, 200ms, 1s) and the longest outage.
const (
	relayLease   = 2 * time.Second
	relayPoll    = 200 * time.Millisecond
	relayBackoff = time.Second
)

// broker is what a proof needs of a broker.
type broker struct {
	name string
	// exactlyOnce: the broker stores each message once (JetStream), not
	// at least once (RabbitMQ).
	exactlyOnce bool
	// env is the environment of a relay process: which broker, where, and
	// the topic's name (the subject, or the queue).
	env []string
	// topic is the messages' topic.
	topic string
	// stop and start stop the broker and start it again.
	stop, start func() error
	// contents returns the messages the broker holds: for each message
	// ID, the payload of every copy.
	contents func(t *testing.T) map[string][]string
}

// scenario is a fault of a proof run.
type scenario string

const (
	killAfterPublish scenario = "relay SIGKILLed between publish and mark-done"
	brokerStopped    scenario = "broker stopped under load"
	pgKilledInClaim  scenario = "relay's PostgreSQL connection killed during a claim"
	threeRelays      scenario = "three relays at once, no fault"
)

// scenarios are the proof's runs on each broker.
var scenarios = []scenario{threeRelays, killAfterPublish, brokerStopped, pgKilledInClaim}

// counts is what a proof run saw.
type counts struct {
	committed   int // messages committed (rows of the outbox, one per payment)
	payments    int // payment rows
	copies      int // message copies in the broker
	distinct    int // distinct message IDs in the broker
	dupAcks     int // publications the broker acknowledged as duplicates (JetStream)
	published   int // publications the sinks confirmed
	reclaimed   int // claims that ran out and were taken back
	fenced      int // marks refused because the claim had been taken back
	retried     int // failed publications, retried
	kills       int // relays killed between confirm and mark
	pgKills     int // relay connections killed during a claim
	relayErrors int // statements the relays saw fail
}

func (c counts) String() string {
	return fmt.Sprintf("%d committed (%d payments), %d in the broker (%d distinct); %d confirmed publications, %d acked as duplicates; %d relays SIGKILLed after a confirm, %d connections killed waiting in a claim or its reclaim; %d reclaimed, %d fenced, %d retried, %d relay errors",
		c.committed, c.payments, c.copies, c.distinct, c.published, c.dupAcks, c.kills, c.pgKills, c.reclaimed, c.fenced, c.retried, c.relayErrors)
}

// proofDB creates a database of its own with the store's tables and the
// payments table, and returns its URL and a pool.
func proofDB(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	url := pgtest.Database(t)
	pool := pgtest.PoolOn(t, url, func(c *pgxpool.Config) { c.MaxConns = 16 })
	ctx := context.Background()
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE payments (key text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return url, pool
}

// prove runs sc on b and checks the broker's contents against the outbox.
func prove(t *testing.T, b *broker, sc scenario) counts {
	sz := sizeOf()
	dbURL, pool := proofDB(t)
	store := pgstore.New(pool)
	t.Cleanup(func() { _ = store.Close() })
	runner := idempotency.NewRunner(store, idempotency.WithTransaction(true), idempotency.WithLease(10*time.Second))

	var c counts
	log := childproc.NewLines()
	env := append([]string{childEnv + "=1", childDB + "=" + dbURL}, b.env...)
	var relays []*childproc.Process
	startRelay := func(hangAt int) {
		n := len(relays)
		bin, args := childproc.Self("TestRelayProcess")
		relays = append(relays, childproc.Start(t, fmt.Sprint("relay-", n), linePrefix, bin, args,
			append(env, childName+"="+fmt.Sprint("outboxproof-relay-", n), childHangAt+"="+strconv.Itoa(hangAt)), log))
	}
	// In the kill scenario, the first relays started hang after some
	// dozens of confirmed publications, each after more than the last, so
	// that the kills spread over the load; the last by the time a relay
	// has published a quarter of the keys, well under its share when the
	// relays split the work unevenly.
	hangs := 0
	hangAt := func() int {
		if sc != killAfterPublish || hangs == sz.kills {
			return 0
		}
		hangs++
		return 10 + hangs*sz.keys/(8*sz.kills)
	}
	for range sz.relays {
		startRelay(hangAt())
	}
	read := func() {
		for _, l := range log.Take() {
			switch l.Kind {
			case "HANG":
				l.From.Kill()
				c.kills++
				startRelay(hangAt())
			case "PUBLISHED":
				c.published++
				if strings.HasSuffix(l.Text, " duplicate") {
					c.dupAcks++
				}
			case "reclaimed":
				c.reclaimed++
			case "fenced":
				c.fenced++
			case "retried":
				c.retried++
			case "dead":
				t.Errorf("a message went dead: %s", l.Text)
			case "error":
				c.relayErrors++
			}
		}
	}

	// The load, and the fault in the middle of it.
	var produced atomic.Int64
	loadDone := make(chan error, 1)
	go func() { loadDone <- produce(runner, b.topic, sz, &produced) }()
	faultDone := make(chan error, 1)
	go func() {
		switch sc {
		case brokerStopped:
			waitFor(&produced, int64(sz.keys/3))
			if err := b.stop(); err != nil {
				faultDone <- err
				return
			}
			time.Sleep(sz.outage) // the outage itself
			faultDone <- b.start()
			return
		case pgKilledInClaim:
			waitFor(&produced, int64(sz.keys/5))
			n, err := killClaims(pool, sz.pgKills)
			c.pgKills = n // read after faultDone
			faultDone <- err
			return
		}
		faultDone <- nil
	}()

	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var deadline <-chan time.Time
	loading, faulting := true, true
	for loading || faulting || !drained(t, pool) {
		select {
		case <-log.Notify:
			read()
			continue
		case err := <-loadDone:
			if err != nil {
				t.Fatal(err)
			}
			loading = false
			deadline = time.After(sz.deadline)
		case err := <-faultDone:
			if err != nil {
				t.Fatal(err)
			}
			faulting = false
		case <-tick.C:
		case <-deadline:
			t.Fatalf("the outbox did not drain within %v of the load's end: %s", sz.deadline, outboxState(t, pool))
		}
	}
	for _, r := range relays {
		r.Stop(15 * time.Second)
	}
	read()

	// What the outbox committed, against what the broker holds.
	committed := map[string]string{} // message ID -> payload
	rows, err := pool.Query(context.Background(), `SELECT storage_key, seq, convert_from(payload, 'UTF8'), status FROM idempotency_outbox`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var key, payload, status string
		var seq int
		if err := rows.Scan(&key, &seq, &payload, &status); err != nil {
			t.Fatal(err)
		}
		if status != string(lifecycle.Done) {
			t.Errorf("message %s/%d is %s", key, seq, status)
		}
		committed[outbox.ID(key, seq)] = payload
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM payments`).Scan(&c.payments); err != nil {
		t.Fatal(err)
	}
	c.committed = len(committed)
	if c.committed != sz.keys || c.payments != sz.keys {
		t.Errorf("%d messages and %d payments committed, want %d of each", c.committed, c.payments, sz.keys)
	}

	got := b.contents(t)
	c.distinct = len(got)
	for id, copies := range got {
		c.copies += len(copies)
		want, ok := committed[id]
		if !ok {
			t.Errorf("the broker holds %s (%q), which no transaction committed", id, copies)
			continue
		}
		for _, p := range copies {
			if p != want {
				t.Errorf("%s holds %q, committed %q", id, p, want)
			}
			if strings.HasPrefix(p, rolledBackPrefix) {
				t.Errorf("%s is of a rolled-back call", id)
			}
		}
		if b.exactlyOnce && len(copies) != 1 {
			t.Errorf("%s is in the broker %d times", id, len(copies))
		}
	}
	for id := range committed {
		if len(got[id]) == 0 {
			t.Errorf("%s was committed, and never reached the broker", id)
		}
	}
	switch {
	case sc == killAfterPublish && c.kills != sz.kills:
		t.Errorf("%d relays killed, want %d", c.kills, sz.kills)
	case sc == pgKilledInClaim && c.pgKills < sz.pgKills:
		t.Errorf("%d connections killed during a claim, want %d", c.pgKills, sz.pgKills)
	}
	t.Logf("%s, %s: %v", b.name, sc, c)
	return c
}

// rolledBackPrefix starts the keys, and payloads, of the calls that roll
// back.
const rolledBackPrefix = "rb-"

// errRolledBack is the error of the calls that roll back.
var errRolledBack = errors.New("declined")

// produce commits sz.keys payments, each with its message, calling every
// key twice (the second call replays), and sz.rolledBack calls that
// enqueue and roll back, spread over about sz.loadFor. It counts the keys
// committed in produced.
func produce(runner *idempotency.Runner, topic string, sz size, produced *atomic.Int64) error {
	total := sz.keys + sz.rolledBack
	every := sz.loadFor * time.Duration(sz.producers) / time.Duration(total)
	var wg sync.WaitGroup
	errs := make(chan error, sz.producers)
	for g := range sz.producers {
		wg.Go(func() {
			pace := time.NewTicker(every)
			defer pace.Stop()
			for i := g; i < total; i += sz.producers {
				<-pace.C
				key, rollback := fmt.Sprint("k-", i), i >= sz.keys
				if rollback {
					key = fmt.Sprint(rolledBackPrefix, i)
				}
				for range 2 {
					if err := pay(runner, topic, key, rollback); err != nil {
						errs <- fmt.Errorf("%s: %w", key, err)
						return
					}
				}
				if !rollback {
					produced.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// pay makes the payment of key in a transactional call: a payment row and
// its message, committed with the key's record; or, with rollback, both
// rolled back. It retries what the database or a fault makes fail.
func pay(runner *idempotency.Runner, topic, key string, rollback bool) error {
	call := idempotency.Call{Name: "pay", Key: key, Payload: []byte(key)}
	var err error
	for range 50 {
		_, err = idempotency.Do(context.Background(), runner, call, func(ctx context.Context) (string, error) {
			tx, _ := pgstore.TxFromContext(ctx)
			if _, err := tx.Exec(ctx, `INSERT INTO payments VALUES ($1)`, key); err != nil {
				return "", err
			}
			if _, err := outbox.Enqueue(ctx, outbox.Message{Topic: topic, Payload: []byte(key)}); err != nil {
				return "", err
			}
			if rollback {
				return "", errRolledBack
			}
			return "paid", nil
		})
		if err == nil || (rollback && errors.Is(err, errRolledBack)) {
			return nil
		}
		var inFlight *idempotency.InFlightError
		if errors.As(err, &inFlight) {
			time.Sleep(inFlight.Remaining) // the retry a client would make
		}
	}
	return err
}

// waitFor returns once n reached at least want.
func waitFor(n *atomic.Int64, want int64) {
	for n.Load() < want {
		time.Sleep(10 * time.Millisecond) // the producers' progress has no signal
	}
}

// drained reports whether every message of the outbox is finished (done,
// dead or canceled).
func drained(t *testing.T, pool *pgxpool.Pool) bool {
	t.Helper()
	var open int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_outbox WHERE status <> ALL ($1::text[])`, lifecycle.Terminal()).Scan(&open); err != nil {
		t.Fatal(err)
	}
	return open == 0
}

// outboxState describes the outbox's messages by status.
func outboxState(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT status, count(*), max(attempts), max(last_error) FROM idempotency_outbox GROUP BY status`)
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	var parts []string
	for rows.Next() {
		var status string
		var n, attempts int
		var lastError *string
		if err := rows.Scan(&status, &n, &attempts, &lastError); err != nil {
			return err.Error()
		}
		parts = append(parts, fmt.Sprintf("%s %d (attempts up to %d, last error %v)", status, n, attempts, lastError))
	}
	return strings.Join(parts, "; ")
}

// killClaims kills the relays' PostgreSQL connections in the middle of a
// claim, rounds times: it locks the outbox table (which the claim's UPDATE
// waits for, as does the reclaim before it), wakes the relays, waits until
// a relay's claim or reclaim is waiting on the lock, terminates the
// backends of every such relay, and lets the table go.
// It returns the number of connections killed.
func killClaims(pool *pgxpool.Pool, rounds int) (int, error) {
	ctx := context.Background()
	killed, budget := 0, 20*rounds
	for tries := 0; rounds > 0; tries++ {
		if tries == budget {
			return killed, errors.New("no relay claimed while the outbox was locked")
		}
		n, err := killClaimRound(ctx, pool)
		if err != nil {
			return killed, err
		}
		if n > 0 {
			killed += n
			rounds--
		}
		time.Sleep(300 * time.Millisecond) // let the relays reconnect and work before the next round
	}
	return killed, nil
}

// killClaimRound locks the outbox for up to a second, and kills the
// relays' claims (and reclaims) that wait on the lock meanwhile. The relays' marks wait
// on it too: a relay whose marks wait claims nothing until the lock goes,
// and the next round may find its claim.
func killClaimRound(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `LOCK TABLE idempotency_outbox IN EXCLUSIVE MODE`); err != nil {
		return 0, err
	}
	// An idle relay claims only when woken: wake them all, as a commit of
	// messages would. A woken relay first takes back the claims that ran
	// out, then claims; either statement waits on the lock.
	if _, err := pool.Exec(ctx, `SELECT pg_notify($1, '')`, outbox.Channel("idempotency_outbox")); err != nil {
		return 0, err
	}
	// In this proof's database only: the relays of a proof running at the
	// same time (another package's, another checkout's) are not ours.
	const waiting = `SELECT pid FROM pg_stat_activity
		WHERE datname = current_database() AND application_name LIKE 'outboxproof-relay-%' AND wait_event_type = 'Lock'
			AND (query LIKE '%FOR UPDATE OF o SKIP LOCKED%' OR query LIKE '%claim_expired%')`
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		var pids []int32
		rows, err := pool.Query(ctx, waiting)
		if err != nil {
			return 0, err
		}
		for rows.Next() {
			var pid int32
			if err := rows.Scan(&pid); err != nil {
				return 0, err
			}
			pids = append(pids, pid)
		}
		if err := rows.Err(); err != nil {
			return 0, err
		}
		for _, pid := range pids {
			var ok bool
			if err := pool.QueryRow(ctx, `SELECT pg_terminate_backend($1, 5000)`, pid).Scan(&ok); err != nil || !ok {
				return 0, fmt.Errorf("terminating backend %d: %v, %v", pid, ok, err)
			}
		}
		if len(pids) > 0 {
			return len(pids), nil
		}
		time.Sleep(5 * time.Millisecond) // pg_stat_activity has no notification
	}
	return 0, nil
}

// The environment of a relay process (TestRelayProcess).
const (
	childEnv    = "OUTBOXPROOF_RELAY" // set: this process is a relay
	childDB     = "OUTBOXPROOF_DATABASE"
	childName   = "OUTBOXPROOF_NAME"    // the relay's name and application_name
	childHangAt = "OUTBOXPROOF_HANG_AT" // the confirmed publication after which the relay hangs; 0: none
	childBroker = "OUTBOXPROOF_BROKER"  // nats or rabbitmq
	childURL    = "OUTBOXPROOF_BROKER_URL"
	childStream = "OUTBOXPROOF_STREAM" // JetStream's stream
)

// TestRelayProcess is a relay process of the proofs, started by prove;
// run by itself it is skipped. It relays the outbox through the broker's
// sink until SIGTERM, reporting each confirmed publication (PUBLISHED id,
// with " duplicate" when JetStream had it already) and the relay's events
// on stdout. After its OUTBOXPROOF_HANG_AT-th confirmed publication it
// reports HANG id and hangs, before the relay could mark the message
// done, to be killed.
func TestRelayProcess(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("a relay process of the proofs")
	}
	childproc.WatchLifeline()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	name := os.Getenv(childName)
	hangAt, _ := strconv.Atoi(os.Getenv(childHangAt))

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

	out := childproc.Reporter{Prefix: linePrefix}
	publish := brokerSink(t, os.Getenv(childBroker))
	var confirmed atomic.Int64
	sink := outbox.SinkFunc(func(ctx context.Context, e outbox.Envelope) error {
		duplicate, err := publish(ctx, e)
		if err != nil {
			return err
		}
		suffix := ""
		if duplicate {
			suffix = " duplicate"
		}
		out.Report("PUBLISHED", "%s%s", e.ID, suffix)
		if confirmed.Add(1) == int64(hangAt) {
			out.Report("HANG", "%s", e.ID)
			select {} // confirmed, not marked: killed here
		}
		return nil
	})
	r := relay.New(pool, sink,
		relay.WithName(name),
		relay.WithClaimLease(relayLease),
		relay.WithPollInterval(relayPoll),
		relay.WithBackoff(50*time.Millisecond, relayBackoff),
		relay.WithConcurrency(4),
		relay.WithBatchSize(50),
		relay.WithObserver(func(_ context.Context, e relay.Event) {
			switch e.Kind {
			case relay.EventReclaimed, relay.EventFenced, relay.EventRetried, relay.EventDead:
				out.Report(e.Kind.String(), "%s %v", e.ID, e.Err)
			case relay.EventError:
				out.Report(e.Kind.String(), "%s", strings.ReplaceAll(e.Err.Error(), "\n", "; "))
			}
		}))
	if err := r.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}
