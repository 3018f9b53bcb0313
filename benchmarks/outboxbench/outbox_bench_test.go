package outboxbench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/benchmarks/load"
	"github.com/go-idempotency/idempotency/brokers/nats/natsink"
	"github.com/go-idempotency/idempotency/brokers/nats/natstest"
	idemrabbit "github.com/go-idempotency/idempotency/brokers/rabbitmq"
	"github.com/go-idempotency/idempotency/brokers/rabbitmq/rabbittest"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/relay"
	"github.com/go-idempotency/idempotency/pgstore"
)

var rounds = flag.Int("rounds", 1, "rounds of BenchmarkEnqueueCost's sides")

// payload is every message's body.
var payload = []byte(`{"id":"pay_123","user":"alice","amount":1999,"currency":"EUR"}`)

func randomID(b testing.TB) string {
	var r [6]byte
	if _, err := rand.Read(r[:]); err != nil {
		b.Fatal(err)
	}
	return hex.EncodeToString(r[:])
}

// database is a database of its own with the store's tables, its pool and
// a transactional Runner on it.
type database struct {
	pool   *pgxpool.Pool
	store  *pgstore.Store
	runner *idempotency.Runner
}

func newDatabase(b testing.TB) *database {
	b.Helper()
	pool := pgtest.Pool(b, func(c *pgxpool.Config) { c.MaxConns = 16 })
	ctx := context.Background()
	if err := pgstore.Migrate(ctx, pool); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE payments (id bigserial PRIMARY KEY, key text NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	store := pgstore.New(pool)
	b.Cleanup(func() { _ = store.Close() })
	return &database{pool: pool, store: store, runner: idempotency.NewRunner(store, idempotency.WithTransaction(true))}
}

// enqueue commits n messages on topic, a hundred per call, each of an
// ordering key of its own so that a relay may publish them concurrently.
func (d *database) enqueue(b testing.TB, topic string, n int) {
	b.Helper()
	for first := 0; first < n; first += 100 {
		msgs := make([]outbox.Message, 0, 100)
		for i := first; i < min(first+100, n); i++ {
			msgs = append(msgs, outbox.Message{Topic: topic, Payload: payload, OrderingKey: fmt.Sprint(topic, i)})
		}
		call := idempotency.Call{Name: "enqueue", Key: fmt.Sprint(topic, "/", first)}
		_, err := idempotency.Do(context.Background(), d.runner, call, func(ctx context.Context) (int, error) {
			_, err := outbox.Enqueue(ctx, msgs...)
			return len(msgs), err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// relayUntil runs a relay on d through sink until it published n
// messages, and returns how long that took.
func (d *database) relayUntil(b testing.TB, sink outbox.Sink, concurrency, n int) time.Duration {
	b.Helper()
	var published atomic.Int64
	done := make(chan struct{})
	failed := make(chan error, 1)
	r := relay.New(d.pool, sink, relay.WithConcurrency(concurrency), relay.WithObserver(func(_ context.Context, e relay.Event) {
		switch e.Kind {
		case relay.EventPublished:
			if published.Add(1) == int64(n) {
				close(done)
			}
		case relay.EventRetried, relay.EventDead, relay.EventError:
			select {
			case failed <- e.Err:
			default:
			}
		}
	}))
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	start := time.Now()
	go func() { stopped <- r.Run(ctx) }()
	defer func() {
		cancel()
		<-stopped
	}()
	select {
	case <-done:
		return time.Since(start)
	case err := <-failed:
		b.Fatal(err)
	case <-time.After(5 * time.Minute):
		b.Fatalf("%d of %d messages published after 5 minutes", published.Load(), n)
	}
	return 0
}

// publishLoop publishes n messages with publish from concurrency
// goroutines, each waiting for its confirm, and returns how long that
// took.
func publishLoop(b testing.TB, concurrency, n int, publish func(i int) error) time.Duration {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, concurrency)
	start := time.Now()
	for range concurrency {
		wg.Go(func() {
			for i := int(next.Add(1)); i <= n; i = int(next.Add(1)) {
				if err := publish(i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	return took
}

// A target is a broker the throughput benchmark publishes to: its sink,
// and the plain loop's publication of message i, on a destination of
// their own for each run.
type target struct {
	name string
	// fresh returns a new destination's topic, the sink to it, and the
	// plain publication to it.
	fresh func(b *testing.B) (topic string, sink outbox.Sink, plain func(i int) error)
}

func jetStreamTarget(b *testing.B) target {
	_, js := natstest.Connect(b, natstest.URL(b))
	return target{name: "jetstream", fresh: func(b *testing.B) (string, outbox.Sink, func(int) error) {
		id := randomID(b)
		stream, subject := "BENCH_"+strings.ToUpper(id), "bench."+id
		if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: stream, Subjects: []string{subject}}); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
		plain := func(i int) error {
			m := nats.NewMsg(subject)
			m.Data = payload
			_, err := js.PublishMsg(context.Background(), m, jetstream.WithMsgID(fmt.Sprint(id, "/", i)), jetstream.WithExpectStream(stream))
			return err
		}
		return subject, natsink.New(js, natsink.WithStream(stream)), plain
	}}
}

func rabbitTarget(b *testing.B) target {
	url := rabbittest.URL(b)
	return target{name: "rabbitmq", fresh: func(b *testing.B) (string, outbox.Sink, func(int) error) {
		queue := rabbittest.Queue(b)
		sink := idemrabbit.NewSink(url)
		b.Cleanup(func() { _ = sink.Close() })
		// The plain loop: one channel in confirm mode per publisher, as
		// the sink has.
		conn := rabbittest.Dial(b)
		var mu sync.Mutex
		var free []*amqp.Channel
		plain := func(i int) error {
			mu.Lock()
			var ch *amqp.Channel
			if len(free) > 0 {
				ch, free = free[len(free)-1], free[:len(free)-1]
			}
			mu.Unlock()
			if ch == nil {
				var err error
				if ch, err = conn.Channel(); err != nil {
					return err
				}
				if err := ch.Confirm(false); err != nil {
					return err
				}
			}
			dc, err := ch.PublishWithDeferredConfirm("", queue, true, false, amqp.Publishing{
				MessageId: fmt.Sprint(queue, "/", i), DeliveryMode: amqp.Persistent, Body: payload,
			})
			if err != nil {
				return err
			}
			if !dc.Wait() {
				return fmt.Errorf("message %d not confirmed", i)
			}
			mu.Lock()
			free = append(free, ch)
			mu.Unlock()
			return nil
		}
		return queue, sink, plain
	}}
}

// BenchmarkRelayThroughput: the relay draining b.N committed messages
// beside a plain publishing loop, each at concurrency 1 and 4, on
// JetStream and RabbitMQ. The metric is msgs/s.
func BenchmarkRelayThroughput(b *testing.B) {
	db := newDatabase(b)
	for _, mk := range []func(*testing.B) target{jetStreamTarget, rabbitTarget} {
		tg := mk(b)
		for _, conc := range []int{1, 4} {
			for _, side := range []string{"plain", "relay"} {
				b.Run(fmt.Sprintf("broker=%s/concurrency=%d/side=%s", tg.name, conc, side), func(b *testing.B) {
					topic, sink, plain := tg.fresh(b)
					var took time.Duration
					if side == "plain" {
						took = publishLoop(b, conc, b.N, plain)
					} else {
						db.enqueue(b, topic, b.N)
						took = db.relayUntil(b, sink, conc, b.N)
					}
					b.ReportMetric(float64(b.N)/took.Seconds(), "msgs/s")
					b.ReportMetric(0, "ns/op")
				})
			}
		}
	}
}

// BenchmarkCommitToStream commits b.N messages one at a time, each with an
// idle relay waiting (woken by the commit's notification), and reports
// the time from the end of the call's function, before its record and
// message commit, to JetStream's ack of the relay's publication.
func BenchmarkCommitToStream(b *testing.B) {
	db := newDatabase(b)
	topic, sink, _ := jetStreamTarget(b).fresh(b)
	confirmed := make(chan string, 1)
	timed := outbox.SinkFunc(func(ctx context.Context, e outbox.Envelope) error {
		err := sink.Publish(ctx, e)
		if err == nil {
			confirmed <- e.ID
		}
		return err
	})
	r := relay.New(db.pool, timed)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- r.Run(ctx) }()
	defer func() {
		cancel()
		<-stopped
	}()

	latencies := make([]time.Duration, 0, b.N)
	for i := range b.N {
		var ids []string
		var committing time.Time
		call := idempotency.Call{Name: "pay", Key: fmt.Sprint("latency-", i)}
		_, err := idempotency.Do(context.Background(), db.runner, call, func(ctx context.Context) (int, error) {
			var err error
			ids, err = outbox.Enqueue(ctx, outbox.Message{Topic: topic, Payload: payload})
			committing = time.Now()
			return 1, err
		})
		if err != nil {
			b.Fatal(err)
		}
		select {
		case id := <-confirmed:
			if id != ids[0] {
				b.Fatalf("confirmed %s, want %s", id, ids[0])
			}
			latencies = append(latencies, time.Since(committing))
		case <-time.After(30 * time.Second):
			b.Fatalf("message %d not in the stream after 30s", i)
		}
	}
	slices.Sort(latencies)
	quantile := func(q float64) float64 {
		return float64(latencies[int(q*float64(len(latencies)-1))]) / float64(time.Millisecond)
	}
	b.ReportMetric(quantile(0.50), "p50-ms")
	b.ReportMetric(quantile(0.99), "p99-ms")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkEnqueueCost puts the transactional route with one enqueued
// message (side=outbox) beside the same route without it (side=tx), over
// loopback HTTP with one client: a round runs both sides once, in an
// order that alternates from round to round.
func BenchmarkEnqueueCost(b *testing.B) {
	db := newDatabase(b)
	mw := idempotency.New(db.store, idempotency.WithTransaction(true))
	route := func(enqueue bool) http.Handler {
		return mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			info, _ := idempotency.FromContext(r.Context())
			tx, _ := pgstore.TxFromContext(r.Context())
			if _, err := tx.Exec(r.Context(), `INSERT INTO payments (key) VALUES ($1)`, info.Key); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			if enqueue {
				if _, err := outbox.Enqueue(r.Context(), outbox.Message{Topic: "payment.created", Payload: payload}); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(payload)
		}))
	}
	client := load.NewClient(1)
	b.Cleanup(client.CloseIdleConnections)
	urls := map[string]string{}
	for side, enqueue := range map[string]bool{"tx": false, "outbox": true} {
		srv, err := load.Serve(route(enqueue))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { srv.Close() })
		urls[side] = srv.URL + "/payments"
	}
	prefix := randomID(b)
	var seq atomic.Int64
	for round := 1; round <= *rounds; round++ {
		sides := []string{"tx", "outbox"}
		if round%2 == 0 {
			slices.Reverse(sides)
		}
		for _, side := range sides {
			b.Run(fmt.Sprintf("round=%d/side=%s", round, side), func(b *testing.B) {
				for range b.N {
					if err := post(client, urls[side], fmt.Sprint(prefix, "-", seq.Add(1))); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// post sends a payment with key and checks that it was made.
func post(client *http.Client, url, key string) error {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"amount":1999,"currency":"EUR"}`))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	res, err := client.Do(req)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if err == nil && res.StatusCode != http.StatusCreated {
		err = fmt.Errorf("%s: status %d", key, res.StatusCode)
	}
	return err
}
