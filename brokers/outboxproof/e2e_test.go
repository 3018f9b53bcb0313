package outboxproof_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/go-idempotency/idempotency/brokers/nats/natstest"
	"github.com/go-idempotency/idempotency/internal/childproc"
	"github.com/go-idempotency/idempotency/internal/pgtest"
)

// The whole loop, as three programs: examples/chi-server (PostgreSQL mode,
// NATS_URL set) takes payments over HTTP, each a payment row, its key's
// record and a payment.created message in one commit; natsrelay publishes
// the outbox to JetStream; examples/payments-consumer applies each message
// with the transactional function API, a ledger row committed with the
// message's record. Clients send every payment twice at once and retry
// until answered, while each program is killed with SIGKILL once, in the
// middle of the load, and started again. At the end the payments, the
// messages in the stream, the ledger rows and the keys sent are as many.

// e2eKeys is the number of payments the clients make.
func e2eKeys() int {
	if os.Getenv(longEnv) == "1" {
		return 3000
	}
	return 300
}

// programs are the binaries of the loop, built for the test.
type programs struct{ api, relay, consumer string }

// buildPrograms builds the three programs from the repository's sources.
func buildPrograms(t *testing.T) programs {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go command not found")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	p := programs{api: filepath.Join(dir, "chi-server"), relay: filepath.Join(dir, "natsrelay"), consumer: filepath.Join(dir, "payments-consumer")}
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for _, b := range []struct{ out, dir, pkg string }{
		{p.api, filepath.Join(root, "examples", "chi-server"), "."},
		{p.relay, filepath.Join(root, "brokers", "nats"), "./cmd/natsrelay"},
		{p.consumer, filepath.Join(root, "examples", "payments-consumer"), "."},
	} {
		wg.Go(func() {
			cmd := exec.Command(goBin, "build", "-o", b.out, b.pkg)
			cmd.Dir = b.dir
			cmd.Env = append(os.Environ(), "GOWORK=off")
			if out, err := cmd.CombinedOutput(); err != nil {
				errs <- fmt.Errorf("building %s: %v\n%s", b.pkg, err, out)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return p
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// waitHTTP returns once GET url answers 200.
func waitHTTP(t *testing.T, url string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		if res, err := http.Get(url); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond) // a program starting has no signal to wait on
	}
	t.Fatalf("%s did not answer within 30s", url)
}

func TestEndToEnd(t *testing.T) {
	keys := e2eKeys()
	progs := buildPrograms(t)
	dbURL := pgtest.Database(t)
	pool := pgtest.PoolOn(t, dbURL)
	nats := natstest.Start(t)
	_, js := natstest.Connect(t, nats.URL)

	apiAddr, ledgerAddr := freeAddr(t), freeAddr(t)
	env := []string{"DATABASE_URL=" + dbURL, "NATS_URL=" + nats.URL, "REDIS_ADDR="}
	runs := map[string]int{}
	launch := func(name, bin string, args ...string) *childproc.Process {
		runs[name]++
		return childproc.Start(t, fmt.Sprintf("%s-%d", name, runs[name]), linePrefix, bin, args, env, nil)
	}
	startAPI := func() *childproc.Process {
		p := launch("chi-server", progs.api, "-addr", apiAddr)
		waitHTTP(t, "http://"+apiAddr+"/stats")
		return p
	}
	startRelay := func() *childproc.Process {
		return launch("natsrelay", progs.relay, "-stream", "PAYMENTS", "-subjects", "payment.>",
			"-lease", "2s", "-poll", "200ms", "-backoff-max", "1s")
	}
	startConsumer := func() *childproc.Process {
		p := launch("payments-consumer", progs.consumer, "-addr", ledgerAddr, "-ack-wait", "2s", "-lease", "2s")
		waitHTTP(t, "http://"+ledgerAddr+"/ledger")
		return p
	}

	api := startAPI()
	relay := startRelay()
	for deadline := time.Now().Add(30 * time.Second); ; { // the relay creates the stream
		if _, err := js.Stream(context.Background(), "PAYMENTS"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("natsrelay did not create the stream within 30s")
		}
		time.Sleep(50 * time.Millisecond) // no signal for a stream's creation
	}
	consumer := startConsumer()

	// The clients, and a SIGKILL of each program at a quarter, half and
	// three quarters of the payments.
	var answered, retries atomic.Int64
	clients := make(chan error, 1)
	go func() { clients <- pay2x(apiAddr, keys, &answered, &retries) }()
	kills := []struct {
		at      int64
		name    string
		restart func()
	}{
		{int64(keys / 4), "chi-server", func() { api.Kill(); api = startAPI() }},
		{int64(keys / 2), "natsrelay", func() { relay.Kill(); relay = startRelay() }},
		{int64(3 * keys / 4), "payments-consumer", func() { consumer.Kill(); consumer = startConsumer() }},
	}
	for _, k := range kills {
		waitFor(&answered, k.at)
		k.restart()
		t.Logf("SIGKILLed %s after %d of %d payments answered, and started it again", k.name, answered.Load(), keys)
	}
	if err := <-clients; err != nil {
		t.Fatal(err)
	}

	// Every message published and applied.
	cons, err := js.Consumer(context.Background(), "PAYMENTS", "ledger")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	var info *jetstream.ConsumerInfo
	for {
		info, err = cons.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if drained(t, pool) && info.NumPending == 0 && info.NumAckPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not settled within 2 minutes: outbox %s; consumer %d pending, %d unacked", outboxState(t, pool), info.NumPending, info.NumAckPending)
		}
		time.Sleep(100 * time.Millisecond) // no signal for the consumer's progress
	}
	for _, p := range []*childproc.Process{consumer, relay, api} {
		p.Stop(15 * time.Second)
	}

	payments, distinctKeys := countPair(t, pool, `SELECT count(*), count(DISTINCT idempotency_key) FROM payments`)
	ledger, distinctPayments := countPair(t, pool, `SELECT count(*), count(DISTINCT payment_id) FROM ledger`)
	streamed, distinctIDs := streamCounts(t, js, "PAYMENTS")
	t.Logf("end to end: %d keys sent twice each at once (%d requests retried); %d payments (%d keys), %d messages in the stream (%d IDs), %d deliveries to the consumer, %d ledger rows (%d payments); each program SIGKILLed once mid-load",
		keys, retries.Load(), payments, distinctKeys, streamed, distinctIDs, info.Delivered.Consumer, ledger, distinctPayments)
	for name, n := range map[string]int{"payments": payments, "payment keys": distinctKeys, "stream messages": streamed,
		"message IDs": distinctIDs, "ledger rows": ledger, "ledger payments": distinctPayments} {
		if n != keys {
			t.Errorf("%d %s, want %d", n, name, keys)
		}
	}
	var unmatched int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM ledger l WHERE NOT EXISTS (SELECT FROM payments p WHERE 'pay_' || p.id = l.payment_id)`).Scan(&unmatched); err != nil || unmatched != 0 {
		t.Errorf("%d ledger rows without their payment (%v)", unmatched, err)
	}
}

// pay2x sends each of keys payments twice at once to the API at addr,
// each request retried until it gets its 201 (a replay, for one of the
// two), and counts in answered the keys whose two requests were answered,
// in retries the requests sent again.
func pay2x(addr string, keys int, answered, retries *atomic.Int64) error {
	client := &http.Client{Timeout: 15 * time.Second}
	work := make(chan int)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range work {
				var pair sync.WaitGroup
				var failed atomic.Value
				for range 2 {
					pair.Go(func() {
						if err := payUntilAnswered(client, addr, i, retries); err != nil {
							failed.Store(err)
						}
					})
				}
				pair.Wait()
				if err, _ := failed.Load().(error); err != nil {
					errs <- err
					return
				}
				answered.Add(1)
			}
		})
	}
	for i := range keys {
		select {
		case work <- i:
		case err := <-errs:
			close(work)
			wg.Wait()
			return err
		}
	}
	close(work)
	wg.Wait()
	close(errs)
	return <-errs
}

// payUntilAnswered posts payment i until it is answered 201, retrying on
// a broken connection (the server was killed), 409 (the original still
// runs, or its owner died and its lease has yet to run out) and 5xx,
// counting each retry in retries.
func payUntilAnswered(client *http.Client, addr string, i int, retries *atomic.Int64) error {
	body := fmt.Sprintf(`{"amount":%d,"currency":"EUR"}`, 100+i)
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/payments", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer alice-token")
		req.Header.Set("Idempotency-Key", fmt.Sprint("e2e-", i))
		res, err := client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			switch {
			case res.StatusCode == http.StatusCreated:
				return nil
			case res.StatusCode != http.StatusConflict && res.StatusCode < 500:
				return fmt.Errorf("payment %d: status %d", i, res.StatusCode)
			}
		}
		retries.Add(1)
		time.Sleep(100 * time.Millisecond) // a client's retry delay
	}
	return errors.New("payment " + fmt.Sprint(i) + " not answered within a minute")
}

func countPair(t *testing.T, pool *pgxpool.Pool, sql string) (int, int) {
	t.Helper()
	var a, b int
	if err := pool.QueryRow(context.Background(), sql).Scan(&a, &b); err != nil {
		t.Fatal(err)
	}
	return a, b
}

// streamCounts returns the number of messages in stream and of distinct
// Nats-Msg-Id among them.
func streamCounts(t *testing.T, js jetstream.JetStream, stream string) (int, int) {
	t.Helper()
	st, err := js.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	n := int(st.CachedInfo().State.Msgs)
	cons, err := st.OrderedConsumer(context.Background(), jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for range n {
		msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		ids[msg.Headers().Get(jetstream.MsgIDHeader)] = true
	}
	return n, len(ids)
}
