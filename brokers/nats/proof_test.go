package idemnats_test

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/go-idempotency/idempotency"
	idemnats "github.com/go-idempotency/idempotency/brokers/nats"
	"github.com/go-idempotency/idempotency/internal/childproc"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/pgstore"
)

// The proof: every business key is published twice, with different message
// IDs; consumers with a short AckWait handle the messages, and consumer
// processes are killed with SIGKILL in the middle of a handler while
// others take their messages over.

// longEnv, set to 1, runs the proof on ten times the keys, with more kills.
const longEnv = "IDEMPOTENCY_NATS_LONG"

// proofSize is the size of a proof run.
type proofSize struct {
	keys     int           // business keys, each published twice
	kills    int           // consumer processes killed mid-handler
	hangAt   int           // the handler run, in a process to be killed, that hangs
	workers  int           // Consume goroutines in each consumer process
	ackWait  time.Duration // the consumer's AckWait
	lease    time.Duration // the Runner's lease
	deadline time.Duration // for every message to be acked
}

func sizeOfProof() proofSize {
	if os.Getenv(longEnv) == "1" {
		return proofSize{keys: 10_000, kills: 8, hangAt: 300, workers: 4, ackWait: 2 * time.Second, lease: 2 * time.Second, deadline: 15 * time.Minute}
	}
	return proofSize{keys: 1_000, kills: 2, hangAt: 100, workers: 4, ackWait: time.Second, lease: 2 * time.Second, deadline: 3 * time.Minute}
}

// The environment of a consumer process (see TestConsumerProcess).
const (
	childEnv       = "IDEMNATS_PROOF_CHILD" // set: this process is a consumer
	childNATS      = "IDEMNATS_PROOF_NATS"
	childStream    = "IDEMNATS_PROOF_STREAM"
	childStore     = "IDEMNATS_PROOF_STORE" // "pg" or "redis"
	childStoreAddr = "IDEMNATS_PROOF_STORE_ADDR"
	childPrefix    = "IDEMNATS_PROOF_PREFIX"
	childHangAt    = "IDEMNATS_PROOF_HANG_AT"
	childWorkers   = "IDEMNATS_PROOF_WORKERS"
	childLease     = "IDEMNATS_PROOF_LEASE"
)

// linePrefix starts every line a consumer process reports on.
const linePrefix = "idemnats-proof "

const proofConsumer = "proof"

// proofStream creates the proof's stream and consumer on a private server
// and publishes every key twice, under different message IDs, with the
// same body.
func proofStream(t *testing.T, size proofSize) (url string, st *stream) {
	t.Helper()
	url = natsURL(t)
	_, js := connect(t, url)
	st = newStream(t, js)
	_, err := js.CreateOrUpdateConsumer(context.Background(), st.name, jetstream.ConsumerConfig{
		Durable:       proofConsumer,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       size.ackWait,
		MaxAckPending: 4 * size.keys,
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range size.keys {
		body := fmt.Sprintf(`{"order":"o-%d","amount":%d}`, i, i)
		for _, copy := range []string{"a", "b"} {
			st.publish(t, body, "Order-Id", fmt.Sprint("o-", i), nats.MsgIdHdr, fmt.Sprintf("m-%d-%s", i, copy))
		}
	}
	info, err := js.Stream(context.Background(), st.name)
	if err != nil {
		t.Fatal(err)
	}
	if n := info.CachedInfo().State.Msgs; n != uint64(2*size.keys) {
		t.Fatalf("the stream holds %d messages, want %d", n, 2*size.keys)
	}
	return url, st
}

// proofCounts is what a proof run saw.
type proofCounts struct {
	executions map[execution]int // handler runs by (key, epoch), killed ones included
	hung       []execution       // the runs that hung until their process was killed
	terms      int               // messages termed
	reported   int               // errors reported
	deliveries uint64            // deliveries of the consumer, redeliveries included
}

type execution struct {
	key   string
	epoch uint64
}

// runConsumerProcesses runs consumer processes (TestConsumerProcess) on the
// proof's stream until every message is acked: two at a time, of which
// one is killed with SIGKILL when its handler hangs (size.hangAt runs in)
// and replaced, size.kills times; the replacement after the last kill
// hangs no more.
func runConsumerProcesses(t *testing.T, size proofSize, url string, st *stream, storeEnv ...string) proofCounts {
	t.Helper()
	counts := proofCounts{executions: map[execution]int{}}
	log := childproc.NewLines()
	env := append([]string{
		childEnv + "=1",
		childNATS + "=" + url,
		childStream + "=" + st.name,
		childWorkers + "=" + strconv.Itoa(size.workers),
		childLease + "=" + size.lease.String(),
	}, storeEnv...)
	var children []*childproc.Process
	start := func(hangAt int) {
		bin, args := childproc.Self("TestConsumerProcess")
		name := fmt.Sprint("consumer-", len(children))
		children = append(children, childproc.Start(t, name, linePrefix, bin, args, append(env, childHangAt+"="+strconv.Itoa(hangAt)), log))
	}
	kills := 0
	read := func() {
		for _, l := range log.Take() {
			switch l.Kind {
			case "EXEC":
				counts.executions[parseExecution(t, l.Text)]++
			case "HANG":
				counts.hung = append(counts.hung, parseExecution(t, l.Text))
				l.From.Kill() // in the middle of the handler
				kills++
				if kills < size.kills {
					start(size.hangAt)
				} else {
					start(0)
				}
			case "ERR":
				counts.reported++
				if strings.HasPrefix(l.Text, "idemnats: term") {
					counts.terms++
					t.Errorf("termed: %s", l.Text)
				}
			}
		}
	}
	start(size.hangAt)
	start(0)
	cons, err := st.js.Consumer(context.Background(), st.name, proofConsumer)
	if err != nil {
		t.Fatal(err)
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(size.deadline)
	for {
		select {
		case <-log.Notify:
			read()
			continue
		case <-tick.C:
		case <-deadline:
			info, _ := cons.Info(context.Background())
			t.Fatalf("after %v: %d kills, consumer %+v", size.deadline, kills, info)
		}
		info, err := cons.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if kills == size.kills && info.NumPending == 0 && info.NumAckPending == 0 {
			counts.deliveries = info.Delivered.Consumer
			break
		}
	}
	for _, c := range children {
		c.Stop(10 * time.Second)
	}
	read() // the last lines of the stopped processes
	return counts
}

// check asserts what holds on every store: every key ran, no message was
// termed, each hung run's key was taken over at a later epoch, and at most
// one run per (key, epoch).
func (c proofCounts) check(t *testing.T, size proofSize) (runs, keysRunTwice int) {
	t.Helper()
	perKey := map[string]int{}
	for e, n := range c.executions {
		if n > 1 {
			t.Errorf("%s ran %d times at epoch %d", e.key, n, e.epoch)
		}
		perKey[e.key] += n
		runs += n
	}
	for i := range size.keys {
		switch n := perKey[fmt.Sprint("o-", i)]; {
		case n == 0:
			t.Errorf("o-%d never ran", i)
		case n > 1:
			keysRunTwice++
		}
	}
	if len(c.hung) != size.kills {
		t.Errorf("%d handlers hung, want %d", len(c.hung), size.kills)
	}
	for _, h := range c.hung {
		if c.executions[execution{h.key, h.epoch + 1}] != 1 {
			t.Errorf("%s hung at epoch %d, was not taken over at epoch %d", h.key, h.epoch, h.epoch+1)
		}
	}
	if c.terms != 0 {
		t.Errorf("%d messages termed", c.terms)
	}
	return runs, keysRunTwice
}

// TestProofPostgres: with the transactional form on pgstore, the effect
// table, which has no unique constraint, holds exactly one row per key.
func TestProofPostgres(t *testing.T) {
	t.Parallel()
	size := sizeOfProof()
	dbURL := pgDatabase(t)
	url, st := proofStream(t, size)
	counts := runConsumerProcesses(t, size, url, st, childStore+"=pg", childStoreAddr+"="+dbURL)
	runs, twice := counts.check(t, size)

	_, pool := newPGStore(t, dbURL)
	var rows, keys, dup int
	err := pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT key),
		(SELECT count(*) FROM (SELECT key FROM effects GROUP BY key HAVING count(*) > 1) d) FROM effects`).Scan(&rows, &keys, &dup)
	if err != nil {
		t.Fatal(err)
	}
	if rows != size.keys || keys != size.keys || dup != 0 {
		t.Errorf("effects: %d rows, %d keys, %d keys with more than one row; want %d, %d, 0", rows, keys, dup, size.keys, size.keys)
	}
	for _, h := range counts.hung {
		var epoch uint64
		if err := pool.QueryRow(context.Background(), "SELECT epoch FROM effects WHERE key = $1", h.key).Scan(&epoch); err != nil || epoch <= h.epoch {
			t.Errorf("%s hung at epoch %d; its row: epoch %d, %v", h.key, h.epoch, epoch, err)
		}
	}
	t.Logf("pgstore (transactional): %d keys, %d messages, %d deliveries, %d kills; %d handler runs (%d keys ran more than once, rolled back); %d effect rows, %d keys with more than one; %d errors reported",
		size.keys, 2*size.keys, counts.deliveries, len(counts.hung), runs, twice, rows, dup, counts.reported)
}

// TestProofRedis: on redisstore, at most one run per (key, epoch), and
// every key ran.
func TestProofRedis(t *testing.T) {
	t.Parallel()
	size := sizeOfProof()
	addr, prefix := redisAddr(t), redistest.Prefix()
	url, st := proofStream(t, size)
	counts := runConsumerProcesses(t, size, url, st, childStore+"=redis", childStoreAddr+"="+addr, childPrefix+"="+prefix)
	runs, twice := counts.check(t, size)
	t.Logf("redisstore: %d keys, %d messages, %d deliveries, %d kills; %d handler runs, %d (key, epoch) pairs, none run twice; %d keys ran more than once (taken over); %d errors reported",
		size.keys, 2*size.keys, counts.deliveries, len(counts.hung), runs, len(counts.executions), twice, counts.reported)
}

// TestProofMemstore: on memstore, in one process, several consumers and a
// consumer whose connection closes in the middle of a handler: exactly
// one run per key.
func TestProofMemstore(t *testing.T) {
	t.Parallel()
	size := sizeOfProof()
	url, st := proofStream(t, size)
	r := idempotency.NewRunner(newMemStore(t), idempotency.WithLease(size.lease))
	var (
		mu       sync.Mutex
		runs     = map[string]int{}
		reported int
		hungID   string // the message the dying consumer's handler holds
	)
	record := func(key string) {
		mu.Lock()
		runs[key]++
		mu.Unlock()
	}
	onError := idemnats.WithErrorHandler(func(_ context.Context, _ jetstream.Msg, err error) {
		mu.Lock()
		reported++
		mu.Unlock()
		if strings.HasPrefix(err.Error(), "idemnats: term") {
			t.Errorf("termed: %v", err)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait() // before the connections close
	defer cancel()

	// The dying consumer: its handler hangs on its first message, its
	// connection closes, and the handler returns once another consumer got
	// the message again.
	dyingConn, dyingJS := connect(t, url)
	hung, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	dying := idemnats.NewProcessor(r, "orders.charge", func(ctx context.Context, msg jetstream.Msg) (int, error) {
		info, _ := idempotency.FromContext(ctx)
		record(info.Key)
		mu.Lock()
		first := hungID == ""
		if first {
			hungID = msg.Headers().Get(nats.MsgIdHdr)
		}
		mu.Unlock()
		if first {
			close(hung)
			<-release
		}
		return 1, nil
	}, idemnats.WithKey(idemnats.HeaderKey("Order-Id")), onError)
	dyingCons, err := dyingJS.Consumer(ctx, st.name, proofConsumer)
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() { _ = dying.Consume(ctx, dyingCons, jetstream.PullMaxMessages(8)) })
	<-hung
	dyingConn.Close()

	key := func(msg jetstream.Msg) (string, error) {
		mu.Lock()
		again := msg.Headers().Get(nats.MsgIdHdr) == hungID
		mu.Unlock()
		if meta, err := msg.Metadata(); again && err == nil && meta.NumDelivered > 1 {
			releaseOnce.Do(func() { close(release) })
		}
		return idemnats.HeaderKey("Order-Id")(msg)
	}
	live := idemnats.NewProcessor(r, "orders.charge", func(ctx context.Context, msg jetstream.Msg) (int, error) {
		info, _ := idempotency.FromContext(ctx)
		record(info.Key)
		return 1, nil
	}, idemnats.WithKey(key), idemnats.WithNakDelay(200*time.Millisecond), onError)
	_, js := connect(t, url)
	cons, err := js.Consumer(ctx, st.name, proofConsumer)
	if err != nil {
		t.Fatal(err)
	}
	for range size.workers {
		wg.Go(func() {
			if err := live.Consume(ctx, cons, jetstream.PullMaxMessages(8)); err != nil {
				t.Error(err)
			}
		})
	}

	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(size.deadline)
	var info *jetstream.ConsumerInfo
	for range tick.C {
		if info, err = cons.Info(ctx); err != nil {
			t.Fatal(err)
		}
		if info.NumPending == 0 && info.NumAckPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: consumer %+v", size.deadline, info)
		}
	}
	select {
	case <-release:
	default:
		t.Fatal("the dying consumer's message was never redelivered")
	}
	mu.Lock()
	defer mu.Unlock()
	total := 0
	for i := range size.keys {
		k := fmt.Sprint("o-", i)
		if runs[k] != 1 {
			t.Errorf("%s ran %d times, want 1", k, runs[k])
		}
		total += runs[k]
	}
	t.Logf("memstore: %d keys, %d messages, %d deliveries, 1 consumer cut off mid-handler; %d handler runs, every key once; %d errors reported",
		size.keys, 2*size.keys, info.Delivered.Consumer, total, reported)
}

// parseExecution parses the text of an EXEC or HANG line: "key epoch".
func parseExecution(t *testing.T, text string) execution {
	t.Helper()
	key, epoch, _ := strings.Cut(text, " ")
	e, err := strconv.ParseUint(epoch, 10, 64)
	if err != nil {
		t.Errorf("a consumer reported %q: %v", text, err)
	}
	return execution{key, e}
}

// TestConsumerProcess is a consumer process of the proof, started by
// runConsumerProcesses; run by itself it is skipped. It consumes the
// proof's stream with several Consume goroutines until SIGTERM, reporting
// each run of its handler (EXEC key epoch) and each error (ERR text) on
// stdout. Its handler run number IDEMNATS_PROOF_HANG_AT does its work,
// reports HANG key epoch and hangs, to be killed.
func TestConsumerProcess(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("a consumer process of the proof tests")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	childproc.WatchLifeline()
	hangAt, _ := strconv.Atoi(os.Getenv(childHangAt))
	workers, _ := strconv.Atoi(os.Getenv(childWorkers))
	lease, err := time.ParseDuration(os.Getenv(childLease))
	if err != nil {
		t.Fatal(err)
	}
	report := (&childproc.Reporter{Prefix: linePrefix}).Report

	var runner *idempotency.Runner
	var write func(ctx context.Context, key string, epoch uint64) error
	switch os.Getenv(childStore) {
	case "pg":
		cfg, err := pgxpool.ParseConfig(os.Getenv(childStoreAddr))
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = int32(3*workers + 2) // a transaction, an extend and an acquire each
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		store := pgstore.New(pool)
		defer store.Close()
		runner = idempotency.NewRunner(store, idempotency.WithLease(lease), idempotency.WithTransaction(true))
		pid := os.Getpid()
		write = func(ctx context.Context, key string, epoch uint64) error {
			tx, _ := pgstore.TxFromContext(ctx)
			_, err := tx.Exec(ctx, "INSERT INTO effects VALUES ($1, $2, $3)", key, epoch, pid)
			return err
		}
	case "redis":
		store := newRedisStore(t, os.Getenv(childStoreAddr), os.Getenv(childPrefix))
		runner = idempotency.NewRunner(store, idempotency.WithLease(lease))
		write = func(context.Context, string, uint64) error { return nil }
	default:
		t.Fatalf("%s=%q", childStore, os.Getenv(childStore))
	}

	var runs sync.Mutex
	run := 0
	handler := func(ctx context.Context, msg jetstream.Msg) (string, error) {
		info, _ := idempotency.FromContext(ctx)
		if err := write(ctx, info.Key, info.Epoch); err != nil {
			return "", err
		}
		report("EXEC", "%s %d", info.Key, info.Epoch)
		runs.Lock()
		run++
		hang := run == hangAt
		runs.Unlock()
		if hang {
			report("HANG", "%s %d", info.Key, info.Epoch)
			<-ctx.Done() // killed meanwhile
		}
		return fmt.Sprintf("charged %s", info.Key), nil
	}
	p := idemnats.NewProcessor(runner, "orders.charge", handler,
		idemnats.WithKey(idemnats.HeaderKey("Order-Id")),
		idemnats.WithNakDelay(200*time.Millisecond),
		idemnats.WithErrorHandler(func(_ context.Context, _ jetstream.Msg, err error) {
			report("ERR", "%s", strings.ReplaceAll(err.Error(), "\n", "; "))
		}))

	_, js := connect(t, os.Getenv(childNATS))
	cons, err := js.Consumer(ctx, os.Getenv(childStream), proofConsumer)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			if err := p.Consume(ctx, cons, jetstream.PullMaxMessages(8)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}
