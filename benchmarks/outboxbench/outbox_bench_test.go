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

var (
	rounds  = flag.Int("rounds", 1, "rounds of BenchmarkEnqueueCost's sides")
	analyze = flag.Bool("analyze", true, "read the outbox's statistics (ANALYZE) once a backlog is enqueued")
)

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
	url    string
	pool   *pgxpool.Pool
	store  *pgstore.Store
	runner *idempotency.Runner
	// walinspect tells whether the pg_walinspect extension could be
	// created in the database, for ownWAL.
	walinspect bool
}

func newDatabase(b testing.TB) *database {
	b.Helper()
	url := pgtest.Database(b)
	pool := pgtest.PoolOn(b, url, func(c *pgxpool.Config) { c.MaxConns = 16 })
	ctx := context.Background()
	if err := pgstore.Migrate(ctx, pool); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE payments (id bigserial PRIMARY KEY, key text NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	// Without the extension (PostgreSQL before 15, or no contrib) only the
	// server's WAL is measured.
	_, err := pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_walinspect`)
	store := pgstore.New(pool)
	b.Cleanup(func() { _ = store.Close() })
	return &database{url: url, pool: pool, store: store, runner: idempotency.NewRunner(store, idempotency.WithTransaction(true)), walinspect: err == nil}
}

// session returns a pool of its own on d's database whose sessions are
// named app (their application_name), for closePool.
func (d *database) session(b testing.TB, app string) *pgxpool.Pool {
	b.Helper()
	return pgtest.PoolOn(b, d.url, func(c *pgxpool.Config) {
		c.MaxConns = 16
		c.ConnConfig.RuntimeParams["application_name"] = app
	})
}

// closePool closes p, whose sessions are named app, and returns once the
// server ended them: a session writes its statistics (its commits among
// them) to pg_stat_database when it ends, and otherwise up to ten seconds
// after it went idle.
func (d *database) closePool(b testing.TB, p *pgxpool.Pool, app string) {
	b.Helper()
	p.Close()
	for deadline := time.Now().Add(10 * time.Second); ; {
		var n int
		if err := d.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n); err != nil {
			b.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d sessions of %s still open 10s after their pool closed", n, app)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// counters are the database's commits and the server's WAL position.
type counters struct{ commits, wal int64 }

// counters reads the database's commits (pg_stat_database.xact_commit) and
// the server's WAL position in bytes, once the commits have settled: the
// statistics of a session that just ended land shortly after it is gone
// from pg_stat_activity.
func (d *database) counters(b testing.TB) counters {
	b.Helper()
	read := func() counters {
		var c counters
		err := d.pool.QueryRow(context.Background(), `
			SELECT xact_commit, (pg_current_wal_lsn() - '0/0')::bigint
			FROM pg_stat_database WHERE datname = current_database()`).Scan(&c.commits, &c.wal)
		if err != nil {
			b.Fatal(err)
		}
		return c
	}
	last := read()
	for range 20 {
		time.Sleep(50 * time.Millisecond)
		c := read()
		if c.commits == last.commits {
			return c
		}
		last = c
	}
	return last
}

// enqueue empties the outbox and commits n messages on topic, a hundred
// per call, each of an ordering key of its own so that a relay may publish
// them concurrently. It commits from sessions of its own, ended before it
// returns, so that their commits are counted before what follows. Then it
// has the table's statistics read (ANALYZE), as autovacuum does once a
// table grew by a tenth and a minute has passed: without them the planner
// takes a fresh backlog for a few rows, and the claim sorts the whole
// backlog each time (the relay and the floor alike; see the package
// documentation).
func (d *database) enqueue(b testing.TB, topic string, n int) {
	b.Helper()
	const app = "outboxbench-enqueue"
	// Each drain starts from the same table: empty, and its backlog.
	if _, err := d.pool.Exec(context.Background(), `TRUNCATE `+pgstore.DefaultOutboxTable); err != nil {
		b.Fatal(err)
	}
	pool := d.session(b, app)
	store := pgstore.New(pool)
	runner := idempotency.NewRunner(store, idempotency.WithTransaction(true))
	for first := 0; first < n; first += 100 {
		msgs := make([]outbox.Message, 0, 100)
		for i := first; i < min(first+100, n); i++ {
			msgs = append(msgs, outbox.Message{Topic: topic, Payload: payload, OrderingKey: fmt.Sprint(topic, i)})
		}
		call := idempotency.Call{Name: "enqueue", Key: fmt.Sprint(topic, "/", first)}
		_, err := idempotency.Do(context.Background(), runner, call, func(ctx context.Context) (int, error) {
			_, err := outbox.Enqueue(ctx, msgs...)
			return len(msgs), err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	_ = store.Close()
	d.closePool(b, pool, app)
	if *analyze {
		if _, err := d.pool.Exec(context.Background(), `ANALYZE `+pgstore.DefaultOutboxTable); err != nil {
			b.Fatal(err)
		}
	}
}

// ownWAL returns the bytes of the WAL records written from the position
// from to the position to that change the database's relations, and of
// the records of their transactions (their commits), read with
// pg_walinspect: the database's share of the server's WAL, which other
// databases write to as well. It returns -1 without the extension, or
// when the server has removed WAL of the range meanwhile (a checkpoint
// recycles it, sooner when other databases write much).
func (d *database) ownWAL(b testing.TB, from, to int64) int64 {
	b.Helper()
	if !d.walinspect {
		return -1
	}
	var n int64
	err := d.pool.QueryRow(context.Background(), `
		WITH r AS (
			SELECT xid, record_length, block_ref
			FROM pg_get_wal_records_info_till_end_of_wal('0/0'::pg_lsn + $1::numeric)
			WHERE start_lsn < '0/0'::pg_lsn + $2::numeric
		), ours AS (
			SELECT xid, record_length,
				block_ref LIKE '%/' || (SELECT oid FROM pg_database WHERE datname = current_database()) || '/%' AS here
			FROM r
		)
		SELECT coalesce(sum(record_length), 0)
		FROM ours
		WHERE here OR (xid <> '0' AND xid IN (SELECT xid FROM ours WHERE here))`, from, to).Scan(&n)
	if err != nil {
		b.Logf("the database's WAL not measured: %v", err)
		return -1
	}
	return n
}

// cost is what draining the outbox cost, per message.
type cost struct {
	commits float64 // transactions committed
	wal     float64 // bytes of WAL the server wrote (any database's)
	ownWAL  float64 // bytes of those records of the database (-1: unknown)
	// hot is the share of the outbox's row updates that were heap-only
	// (HOT): none can be, for each changes the status, which the
	// table's partial indexes name.
	hot float64
	cpu cpuCost
}

// report adds c to b's metrics.
func (c cost) report(b *testing.B) {
	b.ReportMetric(c.commits, "commits/msg")
	b.ReportMetric(c.wal, "WAL-B/msg")
	if c.ownWAL >= 0 {
		b.ReportMetric(c.ownWAL, "own-WAL-B/msg")
	}
	b.ReportMetric(100*c.hot, "HOT-%")
	c.cpu.report(b)
}

// updates reads the outbox's row updates so far, and how many of them
// were heap-only (pg_stat_user_tables: each session's count lands there
// when its transaction ends, at the latest when it ends).
func (d *database) updates(b testing.TB) (all, hot int64) {
	b.Helper()
	err := d.pool.QueryRow(context.Background(), `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = $1`,
		pgstore.DefaultOutboxTable).Scan(&all, &hot)
	if err != nil {
		b.Fatal(err)
	}
	return all, hot
}

// drain runs work, the relay's or the floor's, on a pool of its own whose
// sessions are named app, until it has drained the n messages enqueued,
// and returns how long work said that took, and what the drain cost per
// message: commits and WAL counted from before work started to after its
// sessions ended (they write their statistics then); the CPU time of this
// process, of the database's backends serving work and of the broker's
// process (broker, its PID; 0: not measured).
func (d *database) drain(b testing.TB, app string, broker, n int, work func(pool *pgxpool.Pool) time.Duration) (time.Duration, cost) {
	b.Helper()
	pool := d.session(b, app)
	before := d.counters(b)
	upd0, hot0 := d.updates(b)
	meter := d.startCPU(b, app, broker)
	took := work(pool)
	cpu := meter.stop(b, n)
	d.closePool(b, pool, app)
	after := d.counters(b)
	upd1, hot1 := d.updates(b)
	c := cost{
		commits: float64(after.commits-before.commits) / float64(n),
		wal:     float64(after.wal-before.wal) / float64(n),
		ownWAL:  -1,
		cpu:     cpu,
	}
	if upd1 > upd0 {
		c.hot = float64(hot1-hot0) / float64(upd1-upd0)
	}
	if own := d.ownWAL(b, before.wal, after.wal); own >= 0 {
		c.ownWAL = float64(own) / float64(n)
	}
	return took, c
}

// relayUntil runs a relay through sink, with opts, until it published the
// n messages enqueued, and returns how long that took and what it cost
// (see drain). It checks that the relay's claims took defaultBatch
// messages, the floor's batch.
func (d *database) relayUntil(b testing.TB, sink outbox.Sink, broker, n int, opts ...relay.Option) (time.Duration, cost) {
	b.Helper()
	var published, largest atomic.Int64
	done := make(chan struct{})
	failed := make(chan error, 1)
	observe := relay.WithObserver(func(_ context.Context, e relay.Event) {
		switch e.Kind {
		case relay.EventPublished:
			if published.Add(1) == int64(n) {
				close(done)
			}
		case relay.EventClaimed:
			for l := largest.Load(); int64(e.Count) > l && !largest.CompareAndSwap(l, int64(e.Count)); l = largest.Load() {
			}
		case relay.EventRetried, relay.EventDead, relay.EventError, relay.EventRefused, relay.EventFenced:
			select {
			case failed <- fmt.Errorf("%v: %w", e.Kind, e.Err):
			default:
			}
		}
	})
	took, c := d.drain(b, "outboxbench-relay", broker, n, func(pool *pgxpool.Pool) time.Duration {
		r := relay.New(pool, sink, append(opts, observe)...)
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
	})
	if n >= defaultBatch && largest.Load() != defaultBatch {
		b.Fatalf("the relay's largest claim took %d messages, the floor's %d: set defaultBatch to the relay's default", largest.Load(), defaultBatch)
	}
	return took, c
}

// floorUntil runs the floor (see floor) through sink until it marked the
// n messages enqueued done, and returns how long that took and what it
// cost (see drain).
func (d *database) floorUntil(b testing.TB, sink outbox.Sink, broker, n int) (time.Duration, cost) {
	b.Helper()
	return d.drain(b, "outboxbench-floor", broker, n, func(pool *pgxpool.Pool) time.Duration {
		start := time.Now()
		floor(b, pool, outbox.AsBatchSink(sink, 1), n)
		return time.Since(start)
	})
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

// window is how many publications the broker's own limit keeps waiting
// for their confirms at once (the sinks' default window for PublishBatch
// too).
const window = 256

// A target is a broker the throughput benchmark publishes to, with a
// destination of its own for each run.
type target struct {
	name string
	// broker is the PID of the broker's process, for its CPU time: 0 when
	// it is not on this machine.
	broker int
	fresh  func(b *testing.B) destination
}

// destination is a stream or queue of a target's own.
type destination struct {
	// topic is the messages' Topic.
	topic string
	// sink publishes to the destination.
	sink outbox.Sink
	// plain publishes message i and waits for its confirm.
	plain func(i int) error
	// limit publishes n messages, the broker's own way, keeping up to
	// window of them waiting for their confirms, and returns how long
	// that took, until the last confirm.
	limit func(b *testing.B, n int) time.Duration
}

func jetStreamTarget(b *testing.B) target {
	url := natstest.URL(b)
	nc, js := natstest.Connect(b, url)
	return target{name: "jetstream", broker: listener(url), fresh: func(b *testing.B) destination {
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
		// The limit: PublishMsgAsync, with the ID and the expected stream
		// the sink sends, the JetStream context's cap on pending acks
		// holding the window.
		limit := func(b *testing.B, n int) time.Duration {
			var failures atomic.Int64
			var failure atomic.Value
			async, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(window),
				jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *nats.Msg, err error) {
					failures.Add(1)
					failure.Store(err)
				}))
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			for i := range n {
				m := nats.NewMsg(subject)
				m.Data = payload
				_, err := async.PublishMsgAsync(m, jetstream.WithMsgID(fmt.Sprint(id, "/limit/", i)),
					jetstream.WithExpectStream(stream), jetstream.WithStallWait(time.Minute))
				if err != nil {
					b.Fatal(err)
				}
			}
			select {
			case <-async.PublishAsyncComplete():
			case <-time.After(time.Minute):
				b.Fatalf("%d publications without their acks after a minute", async.PublishAsyncPending())
			}
			took := time.Since(start)
			if n := failures.Load(); n > 0 {
				b.Fatalf("%d publications failed, as %v", n, failure.Load())
			}
			return took
		}
		return destination{topic: subject, sink: natsink.New(js, natsink.WithStream(stream)), plain: plain, limit: limit}
	}}
}

func rabbitTarget(b *testing.B) target {
	url := rabbittest.URL(b)
	broker := 0
	if u, err := amqp.ParseURI(url); err == nil {
		broker = listener(fmt.Sprintf("amqp://%s:%d", u.Host, u.Port))
	}
	return target{name: "rabbitmq", broker: broker, fresh: func(b *testing.B) destination {
		queue := rabbittest.Queue(b)
		sink := idemrabbit.NewSink(url)
		b.Cleanup(func() { _ = sink.Close() })
		// The plain loop: one channel in confirm mode per publisher, as
		// the sink has.
		conn := rabbittest.Dial(b)
		message := func(i int) amqp.Publishing {
			return amqp.Publishing{MessageId: fmt.Sprint(queue, "/", i), DeliveryMode: amqp.Persistent, Body: payload}
		}
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
			dc, err := ch.PublishWithDeferredConfirm("", queue, true, false, message(i))
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
		// The limit: one channel in confirm mode, pipelined, the sink's
		// messages (persistent, mandatory, with their IDs), the oldest
		// confirm awaited while window of them are pending.
		limit := func(b *testing.B, n int) time.Duration {
			ch, err := conn.Channel()
			if err == nil {
				err = ch.Confirm(false)
			}
			if err != nil {
				b.Fatal(err)
			}
			defer ch.Close()
			pending := make([]*amqp.DeferredConfirmation, 0, window)
			start := time.Now()
			for i := range n {
				if len(pending) == window {
					if !pending[0].Wait() {
						b.Fatalf("message %d not confirmed", pending[0].DeliveryTag)
					}
					pending = pending[1:]
				}
				dc, err := ch.PublishWithDeferredConfirm("", queue, true, false, message(i))
				if err != nil {
					b.Fatal(err)
				}
				pending = append(pending, dc)
			}
			for _, dc := range pending {
				if !dc.Wait() {
					b.Fatalf("message %d not confirmed", dc.DeliveryTag)
				}
			}
			return time.Since(start)
		}
		return destination{topic: queue, sink: sink, plain: plain, limit: limit}
	}}
}

// batchOf returns n envelopes on topic, each of an ordering key of its
// own, as a relay would present them.
func batchOf(topic string, n int) []outbox.Envelope {
	es := make([]outbox.Envelope, n)
	now := time.Now()
	for i := range es {
		es[i] = outbox.Envelope{ID: fmt.Sprint(topic, "/batch/", i), Topic: topic, Payload: payload,
			OrderingKey: fmt.Sprint(topic, i), Attempt: 1, EnqueuedAt: now}
	}
	return es
}

// BenchmarkRelayThroughput: on JetStream and RabbitMQ, in msgs/s, in
// this order:
//
//   - side=limit: the broker's own limit, its asynchronous publication
//     with a window of 256 confirms pending;
//   - side=batch: the sink's PublishBatch given the b.N messages at once;
//   - side=floor: the floor of the relay's work (see floor), draining b.N
//     committed messages;
//   - at concurrency 1 and 4: side=plain, a publishing loop, each message
//     waiting for its confirm, with as many publishers; side=relay, the
//     relay at its defaults but for WithConcurrency, draining b.N
//     committed messages through the sink (a BatchSink: the concurrency
//     does not apply to it);
//   - side=relay-each: the relay through the sink's Publish alone, one
//     message per call, 4 at a time (WithConcurrency(4)), as for a sink
//     without PublishBatch.
//
// The rows after the limit report their rate over it (of-limit), the
// relay's over the floor's (of-floor); the drains report the commits and
// WAL bytes per message, the share of HOT updates; and every row but the
// plain loop's the CPU time per message of this process (the relay's, the
// floor's, or the broker's client's), of the database's backends serving
// the drain, and of the broker's process.
func BenchmarkRelayThroughput(b *testing.B) {
	db := newDatabase(b)
	for _, mk := range []func(*testing.B) target{jetStreamTarget, rabbitTarget} {
		tg := mk(b)
		// The limit's and the floor's rates in msgs/s, once measured.
		var limit, floorRate float64
		run := func(name string, f func(b *testing.B, d destination) time.Duration) {
			b.Run(fmt.Sprintf("broker=%s/%s", tg.name, name), func(b *testing.B) {
				took := f(b, tg.fresh(b))
				rate := float64(b.N) / took.Seconds()
				b.ReportMetric(rate, "msgs/s")
				b.ReportMetric(0, "ns/op")
				side := name[strings.LastIndex(name, "=")+1:]
				switch {
				case side == "limit":
					limit = rate
				case limit > 0:
					b.ReportMetric(rate/limit, "of-limit")
				}
				switch {
				case side == "floor":
					floorRate = rate
				case strings.HasPrefix(side, "relay") && floorRate > 0:
					b.ReportMetric(rate/floorRate, "of-floor")
				}
			})
		}
		run(fmt.Sprintf("window=%d/side=limit", window), func(b *testing.B, d destination) time.Duration {
			meter := (*database)(nil).startCPU(b, "", tg.broker)
			took := d.limit(b, b.N)
			meter.stop(b, b.N).report(b)
			return took
		})
		run(fmt.Sprintf("window=%d/side=batch", window), func(b *testing.B, d destination) time.Duration {
			es := batchOf(d.topic, b.N)
			meter := (*database)(nil).startCPU(b, "", tg.broker)
			start := time.Now()
			errs := outbox.AsBatchSink(d.sink, 1).PublishBatch(context.Background(), es)
			took := time.Since(start)
			meter.stop(b, b.N).report(b)
			for i, err := range errs {
				if err != nil {
					b.Fatalf("%s: %v", es[i].ID, err)
				}
			}
			return took
		})
		run(fmt.Sprintf("batch=%d/side=floor", defaultBatch), func(b *testing.B, d destination) time.Duration {
			db.enqueue(b, d.topic, b.N)
			took, c := db.floorUntil(b, d.sink, tg.broker, b.N)
			c.report(b)
			return took
		})
		for _, conc := range []int{1, 4} {
			run(fmt.Sprintf("concurrency=%d/side=plain", conc), func(b *testing.B, d destination) time.Duration {
				return publishLoop(b, conc, b.N, d.plain)
			})
			run(fmt.Sprintf("concurrency=%d/side=relay", conc), func(b *testing.B, d destination) time.Duration {
				db.enqueue(b, d.topic, b.N)
				took, c := db.relayUntil(b, d.sink, tg.broker, b.N, relay.WithConcurrency(conc))
				c.report(b)
				return took
			})
		}
		run("concurrency=4/side=relay-each", func(b *testing.B, d destination) time.Duration {
			db.enqueue(b, d.topic, b.N)
			each := outbox.SinkFunc(d.sink.Publish) // a Sink, not a BatchSink
			took, c := db.relayUntil(b, each, tg.broker, b.N, relay.WithConcurrency(4))
			c.report(b)
			return took
		})
	}
}

// BenchmarkCommitToStream commits b.N messages one at a time, each with an
// idle relay at its defaults waiting (woken by the commit's notification),
// and reports the time from the end of the call's function, before its
// record and message commit, to JetStream's ack of the relay's
// publication, through the sink's PublishBatch as the relay calls it.
func BenchmarkCommitToStream(b *testing.B) {
	db := newDatabase(b)
	dest := jetStreamTarget(b).fresh(b)
	topic := dest.topic
	confirmed := make(chan string, 1)
	timed := timedSink{batch: outbox.AsBatchSink(dest.sink, 1), confirmed: confirmed}
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

// timedSink is a sink and BatchSink that sends the ID of each envelope its
// BatchSink confirmed on confirmed.
type timedSink struct {
	batch     outbox.BatchSink
	confirmed chan<- string
}

func (t timedSink) Publish(ctx context.Context, e outbox.Envelope) error {
	return t.PublishBatch(ctx, []outbox.Envelope{e})[0]
}

func (t timedSink) PublishBatch(ctx context.Context, es []outbox.Envelope) []error {
	errs := t.batch.PublishBatch(ctx, es)
	for i, err := range errs {
		if err == nil {
			t.confirmed <- es[i].ID
		}
	}
	return errs
}
