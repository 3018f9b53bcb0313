package idemrabbit_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/go-idempotency/idempotency"
	idemrabbit "github.com/go-idempotency/idempotency/brokers/rabbitmq"
	"github.com/go-idempotency/idempotency/brokers/rabbitmq/rabbittest"
	"github.com/go-idempotency/idempotency/pgstore"
)

// limited is the options of the Processors of the delivery-limit tests: a
// short backoff, the queues' limit of 3, errors collected in log.
func limited(log *errorLog) []idemrabbit.ProcessorOption {
	return []idemrabbit.ProcessorOption{
		idemrabbit.WithBackoff(20*time.Millisecond, time.Second),
		idemrabbit.WithDeliveryLimit(3),
		idemrabbit.WithErrorHandler(log.handle),
	}
}

// errorLog collects what a Processor's error handler gets.
type errorLog struct {
	mu   sync.Mutex
	errs []error
}

func (l *errorLog) handle(_ context.Context, _ amqp.Delivery, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, err)
}

// count returns how many of the errors wrap target.
func (l *errorLog) count(target error) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, err := range l.errs {
		if errors.Is(err, target) {
			n++
		}
	}
	return n
}

// settled is what one call of Process returned.
type settled struct {
	consumer int
	first    bool // the consumer's first delivery
	res      idempotency.Result[string]
	s        idemrabbit.Settlement
	err      error
}

func (o settled) String() string {
	return fmt.Sprintf("{consumer %d: %v, %v delivery %d (delay %v, final %v), err %v}",
		o.consumer, o.res.Outcome, o.s.Action, o.s.Delivery, o.s.Delay.Round(time.Millisecond), o.s.Final, o.err)
}

// TestDuplicateWaitsForHolder is the payment a quorum queue must not lose:
// a message published twice (the relay's at least once) to a queue with
// x-delivery-limit 3; the first copy's handler is slow and then fails
// once, while the second copy reaches another Processor and finds the key
// in flight. The duplicate must keep its delivery rather than requeue it
// (each requeue counts toward the limit), so that the handler finally
// succeeds, once, and nothing is dropped or dead-lettered.
func TestDuplicateWaitsForHolder(t *testing.T) {
	t.Run("memstore", func(t *testing.T) {
		duplicateWaitsForHolder(t, memRunner(t, idempotency.WithLease(time.Second)), nil)
	})
	t.Run("pgstore", func(t *testing.T) {
		r, pool := pgRunner(t, "payments", idempotency.WithLease(time.Second))
		duplicateWaitsForHolder(t, r, pool)
	})
}

func duplicateWaitsForHolder(t *testing.T, r *idempotency.Runner, pool *pgxpool.Pool) {
	queue, dlq := quorumQueue(t, 3)
	for range 2 {
		publish(t, queue, "pay_7/1", `{"amount":1999}`)
	}
	holding, duplicateArrived := make(chan struct{}), make(chan struct{})
	var runs, successes atomic.Int32
	apply := func(ctx context.Context, d amqp.Delivery) (string, error) {
		if pool != nil {
			tx, _ := pgstore.TxFromContext(ctx)
			if _, err := tx.Exec(ctx, `INSERT INTO payments VALUES ($1)`, d.MessageId); err != nil {
				return "", err
			}
		}
		if runs.Add(1) == 1 {
			// Slow: the duplicate reaches the other Processor meanwhile, and
			// has time to spend every delivery the queue allows if it
			// requeues.
			close(holding)
			select {
			case <-duplicateArrived:
			case <-time.After(10 * time.Second):
			}
			time.Sleep(500 * time.Millisecond)
			return "", errors.New("provider timed out")
		}
		successes.Add(1)
		return "applied", nil
	}
	var log errorLog
	holder := idemrabbit.NewProcessor(r, "payments.apply", apply, limited(&log)...)
	other := idemrabbit.NewProcessor(r, "payments.apply", apply, limited(&log)...)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := make(chan settled, 64)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	consume := func(consumer int, p *idemrabbit.Processor[string], ds <-chan amqp.Delivery) {
		defer wg.Done()
		for i := 0; ; i++ {
			var d amqp.Delivery
			select {
			case d = <-ds:
			case <-ctx.Done():
				return
			}
			if consumer == 2 && i == 0 {
				close(duplicateArrived)
			}
			res, s, err := p.Process(ctx, d)
			select {
			case out <- settled{consumer, i == 0, res, s, err}:
			case <-ctx.Done():
				return
			}
		}
	}
	// Each consumer holds one delivery at most: the first takes one copy
	// and runs the handler; only then does the second subscribe, and take
	// the other.
	wg.Add(2)
	go consume(1, holder, subscribe(t, queue, 1))
	select {
	case <-holding:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler did not start within 10s")
	}
	go consume(2, other, subscribe(t, queue, 1))

	var got []settled
	acks := 0
	deadline := time.After(15 * time.Second)
	for acks < 2 {
		select {
		case o := <-out:
			got = append(got, o)
			if o.s.Action == idemrabbit.Ack {
				acks++
			}
		case <-deadline:
			t.Fatalf("after 15s: %d acks, %d runs, %d successes, %d dead-lettered; settlements %v",
				acks, runs.Load(), successes.Load(), ready(t, dlq), got)
		}
	}
	cancel()
	wg.Wait()

	if n := successes.Load(); n != 1 {
		t.Fatalf("the handler succeeded %d times, want 1 (%d runs)", n, runs.Load())
	}
	for _, o := range got {
		if o.s.Action == idemrabbit.Reject || o.s.Final {
			t.Fatalf("a copy was rejected: %v", o)
		}
		if o.consumer == 2 && o.first && (o.s.Action != idemrabbit.Ack || o.s.Delivery != 1) {
			t.Fatalf("the duplicate was not kept while the holder ran: %v", o)
		}
	}
	if n := log.count(idemrabbit.ErrLastDelivery); n != 0 {
		t.Fatalf("%d last deliveries reported, want 0", n)
	}
	if q, d := ready(t, queue), ready(t, dlq); q != 0 || d != 0 {
		t.Fatalf("%d messages left in the queue, %d dead-lettered; want 0, 0", q, d)
	}
	if pool != nil {
		if n := rows(t, pool, "payments"); n != 1 {
			t.Fatalf("%d payment rows, want 1", n)
		}
	}
	t.Logf("settlements: %v", got)
}

// TestFailingHandlerBacksOff: a handler that always fails is not retried
// hot: each redelivery is held for a backoff that grows (doubling, with
// jitter in the upper half), so that in a window of 1.5s it runs a
// handful of times, where requeueing at once ran it thousands of times.
func TestFailingHandlerBacksOff(t *testing.T) {
	queue, _ := quorumQueue(t, -1)
	publish(t, queue, "k13/1", "p")
	var runs atomic.Int32
	fail := errors.New("provider down")
	const base = 20 * time.Millisecond
	p := idemrabbit.NewProcessor(memRunner(t), "payments.apply", func(context.Context, amqp.Delivery) (string, error) {
		runs.Add(1)
		return "", fail
	}, idemrabbit.WithBackoff(base, time.Minute), idemrabbit.WithErrorHandler(quiet))

	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	ds := subscribe(t, queue, 1)
	var got []idemrabbit.Settlement
	for ctx.Err() == nil {
		select {
		case d := <-ds:
			_, s, err := p.Process(ctx, d)
			if !errors.Is(err, fail) || s.Action != idemrabbit.Requeue {
				t.Fatalf("run %d: %+v, %v", runs.Load(), s, err)
			}
			got = append(got, s)
		case <-ctx.Done():
		}
	}
	n := int(runs.Load())
	t.Logf("%d runs in 1.5s; settlements %+v", n, got)
	// 20ms doubling: the sixth hold alone is 320ms or more, so the seventh
	// run cannot start within 1.5s (10 leaves room for a slow broker).
	if n < 3 || n > 10 {
		t.Fatalf("the handler ran %d times in 1.5s, want 3 to 10", n)
	}
	for i, s := range got {
		step := base << i
		if s.Delivery != i+1 || s.Delay < step/2 || s.Delay >= step {
			t.Fatalf("settlement %d: %+v; want delivery %d, a delay in [%v, %v)", i+1, s, i+1, step/2, step)
		}
		if i > 0 && s.Delay <= got[i-1].Delay {
			t.Fatalf("the delays did not grow: %+v", got)
		}
	}
}

// TestLastDelivery: on a quorum queue with x-delivery-limit 3, a message
// whose handler always fails is delivered 4 times; the Processor, told
// the limit, requeues the first three after their backoff and rejects the
// fourth, reporting it final once (ErrLastDelivery, with the handler's
// error), and the queue dead-letters it.
func TestLastDelivery(t *testing.T) {
	queue, dlq := quorumQueue(t, 3)
	publish(t, queue, "k14/1", "p")
	var runs atomic.Int32
	fail := errors.New("card declined by a bug")
	var log errorLog
	p := idemrabbit.NewProcessor(memRunner(t), "payments.apply", func(context.Context, amqp.Delivery) (string, error) {
		runs.Add(1)
		return "", fail
	}, idemrabbit.WithBackoff(10*time.Millisecond, 50*time.Millisecond), idemrabbit.WithDeliveryLimit(3), idemrabbit.WithErrorHandler(log.handle))

	ds := subscribe(t, queue, 1)
	for i := 1; i <= 4; i++ {
		_, s, err := p.Process(context.Background(), next(t, ds))
		final := i == 4
		want := idemrabbit.Requeue
		if final {
			want = idemrabbit.Reject
		}
		if s.Delivery != i || s.Action != want || s.Final != final || !errors.Is(err, fail) || errors.Is(err, idemrabbit.ErrLastDelivery) != final {
			t.Fatalf("delivery %d: %+v, %v", i, s, err)
		}
		if final {
			t.Logf("the last delivery: %v", err)
		}
	}
	if n := log.count(idemrabbit.ErrLastDelivery); n != 1 {
		t.Fatalf("the last delivery was reported %d times, want once", n)
	}
	dead := next(t, subscribe(t, dlq, 1))
	if dead.MessageId != "k14/1" {
		t.Fatalf("dead-lettered %q, want k14/1", dead.MessageId)
	}
	if n, q := runs.Load(), ready(t, queue); n != 4 || q != 0 {
		t.Fatalf("%d runs, %d messages left in the queue; want 4, 0", n, q)
	}
}

// TestHolderChannelLost is the payment the old requeue-at-once lost: one
// message, whose consumer's channel closes while its handler runs (a
// connection cut), so that the broker delivers it again, to another
// consumer, while the first handler still holds the key. The second
// consumer must keep that delivery and wait: requeued at once, each
// redelivery would count toward x-delivery-limit until the queue
// dead-letters the message; the first handler then fails, its settlement
// goes nowhere (its channel is gone), and the payment never runs. Waiting,
// the second consumer takes the key over once the first released it, and
// the payment succeeds once.
func TestHolderChannelLost(t *testing.T) {
	t.Run("memstore", func(t *testing.T) {
		holderChannelLost(t, memRunner(t, idempotency.WithLease(time.Second)))
	})
	t.Run("pgstore", func(t *testing.T) {
		r, _ := pgRunner(t, "payments", idempotency.WithLease(time.Second))
		holderChannelLost(t, r)
	})
}

func holderChannelLost(t *testing.T, r *idempotency.Runner) {
	queue, dlq := quorumQueue(t, 3)
	publish(t, queue, "pay_9/1", `{"amount":1999}`)
	holding, redelivered := make(chan struct{}), make(chan struct{})
	var runs, successes atomic.Int32
	apply := func(ctx context.Context, d amqp.Delivery) (string, error) {
		if runs.Add(1) == 1 {
			close(holding)
			select {
			case <-redelivered:
			case <-time.After(10 * time.Second):
			}
			time.Sleep(500 * time.Millisecond) // long enough to spend every delivery the queue allows
			return "", errors.New("provider timed out")
		}
		successes.Add(1)
		return "applied", nil
	}
	var log errorLog
	holder := idemrabbit.NewProcessor(r, "payments.apply", apply, limited(&log)...)
	other := idemrabbit.NewProcessor(r, "payments.apply", apply, limited(&log)...)

	ch := rabbittest.Channel(t)
	if err := ch.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	holderDone := make(chan struct{})
	go func() {
		defer close(holderDone)
		_, _, _ = holder.Process(context.Background(), next(t, ds))
	}()
	select {
	case <-holding:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler did not start within 10s")
	}
	// The holder's connection is cut: its delivery goes back to the queue
	// while its handler runs.
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}

	ds2 := subscribe(t, queue, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var got []settled
	for {
		var d amqp.Delivery
		select {
		case d = <-ds2:
		case <-ctx.Done():
			t.Fatalf("no ack within 15s: %d runs, %d successes, %d dead-lettered; settlements %v",
				runs.Load(), successes.Load(), ready(t, dlq), got)
		}
		if len(got) == 0 {
			close(redelivered)
		}
		res, s, err := other.Process(ctx, d)
		got = append(got, settled{2, len(got) == 0, res, s, err})
		if s.Action == idemrabbit.Ack {
			break
		}
	}
	<-holderDone
	if n := successes.Load(); n != 1 || got[len(got)-1].res.Outcome.Ran() != true {
		t.Fatalf("the payment succeeded %d times (%d runs), want once, on the redelivery; settlements %v", n, runs.Load(), got)
	}
	if len(got) != 1 {
		t.Fatalf("the redelivery was settled %d times before its ack, want once: %v", len(got), got)
	}
	if q, d := ready(t, queue), ready(t, dlq); q != 0 || d != 0 {
		t.Fatalf("%d messages left in the queue, %d dead-lettered; want 0, 0", q, d)
	}
	t.Logf("settlements: %v", got)
}
