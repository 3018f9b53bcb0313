package idemnats_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/go-idempotency/idempotency"
	idemnats "github.com/go-idempotency/idempotency/brokers/nats"
	"github.com/go-idempotency/idempotency/memstore"
	"github.com/go-idempotency/idempotency/pgstore"
)

// ackWait is the AckWait of the tests' consumers: short, so that a message
// that was not acked comes back soon.
const ackWait = time.Second

// quiet is how long a test waits to see that a message does not come back:
// well past the AckWait, after which an unacked message is redelivered.
const quiet = 2 * ackWait

// fixture is a stream with one consumer on a private server, and the
// errors a Processor reported.
type fixture struct {
	st   *stream
	cons jetstream.Consumer
	errs chan error
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	_, js := connect(t, natsURL(t))
	st := newStream(t, js)
	return &fixture{st: st, cons: st.consumer(t, "worker", ackWait), errs: make(chan error, 100)}
}

// options are the Processor options of the fixture: the key from the
// Order-Id header, the fixture's AckWait, errors collected.
func (f *fixture) options(more ...idemnats.Option) []idemnats.Option {
	return append([]idemnats.Option{
		idemnats.WithKey(idemnats.HeaderKey("Order-Id")),
		idemnats.WithAckWait(ackWait),
		idemnats.WithNakDelay(300 * time.Millisecond),
		f.collect(),
	}, more...)
}

// collect is the option that sends the errors reported to f.errs.
func (f *fixture) collect() idemnats.Option {
	return idemnats.WithErrorHandler(func(_ context.Context, _ jetstream.Msg, err error) { f.errs <- err })
}

// next returns the next message of the consumer, failing t when none
// comes within a few seconds.
func (f *fixture) next(t *testing.T) jetstream.Msg {
	t.Helper()
	msg, err := f.cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatalf("no message: %v", err)
	}
	return msg
}

// none fails t when a message is delivered within d.
func (f *fixture) none(t *testing.T, d time.Duration) {
	t.Helper()
	msg, err := f.cons.Next(jetstream.FetchMaxWait(d))
	if err == nil {
		meta, _ := msg.Metadata()
		t.Fatalf("message %q delivered again (delivery %d)", msg.Data(), meta.NumDelivered)
	}
	if !errors.Is(err, nats.ErrTimeout) {
		t.Fatalf("fetch: %v", err)
	}
}

// reported returns the error reported next, failing t when none was.
func (f *fixture) reported(t *testing.T) error {
	t.Helper()
	select {
	case err := <-f.errs:
		return err
	default:
		t.Fatal("no error was reported")
		return nil
	}
}

// noneReported fails t when an error was reported.
func (f *fixture) noneReported(t *testing.T) {
	t.Helper()
	select {
	case err := <-f.errs:
		t.Fatalf("reported: %v", err)
	default:
	}
}

// pending returns the consumer's count of delivered, unacknowledged
// messages.
func (f *fixture) pending(t *testing.T) int {
	t.Helper()
	info, err := f.cons.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.NumAckPending
}

func delivery(t *testing.T, msg jetstream.Msg) uint64 {
	t.Helper()
	meta, err := msg.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	return meta.NumDelivered
}

func wantOutcome(t *testing.T, got, want idemnats.Outcome) {
	t.Helper()
	if got != want {
		t.Fatalf("outcome %+v, want %+v", got, want)
	}
}

// wantRuns fails t unless the handler ran want times.
func wantRuns(t *testing.T, runs *atomic.Int64, want int64) {
	t.Helper()
	if n := runs.Load(); n != want {
		t.Fatalf("%d runs, want %d", n, want)
	}
}

// counter is a handler that counts its runs and returns the run's number.
type counter struct{ runs atomic.Int64 }

func (c *counter) handle(ctx context.Context, msg jetstream.Msg) (string, error) {
	return fmt.Sprint("run ", c.runs.Add(1)), nil
}

// blockingStore holds each Complete until release is closed, and
// signals held when one arrives.
type blockingStore struct {
	idempotency.Store
	held, release chan struct{}
}

func (s *blockingStore) Complete(ctx context.Context, key, token string, resp *idempotency.Response, ttl time.Duration) error {
	close(s.held)
	<-s.release
	return s.Store.Complete(ctx, key, token, resp, ttl)
}

// TestAckAfterComplete: the handler runs once; its message is acked after
// the record completed, not before, and is not redelivered; a second
// publication with the same key is acked as a replay.
func TestAckAfterComplete(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	store := &blockingStore{Store: newMemStore(t), held: make(chan struct{}), release: make(chan struct{})}
	var c counter
	p := idemnats.NewProcessor(idempotency.NewRunner(store), "orders.charge", c.handle, f.options()...)
	f.st.publish(t, "charge 1", "Order-Id", "o-1", nats.MsgIdHdr, "m-1")
	f.st.publish(t, "charge 1", "Order-Id", "o-1", nats.MsgIdHdr, "m-2")

	type result struct {
		out idemnats.Outcome
		err error
	}
	done := make(chan result, 1)
	first := f.next(t)
	go func() {
		out, err := p.Process(context.Background(), first)
		done <- result{out, err}
	}()
	<-store.held // the handler returned; the record is not complete yet
	if n := f.pending(t); n != 1 {
		t.Fatalf("%d messages pending while the record completes, want 1: acked too early", n)
	}
	close(store.release)
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	wantOutcome(t, r.out, idemnats.Outcome{Action: idemnats.Ack, Ran: true, Epoch: 1, Reason: idempotency.OutcomeStored})
	if n := f.pending(t); n != 0 {
		t.Fatalf("%d messages pending after the confirmed ack, want 0", n)
	}

	out, err := p.Process(context.Background(), f.next(t))
	if err != nil {
		t.Fatal(err)
	}
	wantOutcome(t, out, idemnats.Outcome{Action: idemnats.Ack, Replayed: true, Reason: idempotency.OutcomeReplayed})
	f.none(t, quiet)
	wantRuns(t, &c.runs, 1)
	f.noneReported(t)
}

// TestErrorNaks: a handler's error releases the key and naks the message
// after the backoff's first delay (at most the base, more than half of
// it); the redelivery runs the handler again.
func TestErrorNaks(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	declined := errors.New("provider unavailable")
	var runs atomic.Int64
	p := idemnats.NewProcessor(idempotency.NewRunner(newMemStore(t)), "orders.charge",
		func(ctx context.Context, msg jetstream.Msg) (int, error) {
			if runs.Add(1) == 1 {
				return 0, declined
			}
			return 1, nil
		}, f.options(idemnats.WithNakDelay(700*time.Millisecond))...)
	f.st.publish(t, "charge", "Order-Id", "o-1")

	out, err := p.Process(context.Background(), f.next(t))
	naked := time.Now()
	if !errors.Is(err, declined) {
		t.Fatalf("error %v, want the handler's", err)
	}
	if out.Delay <= 350*time.Millisecond || out.Delay > 700*time.Millisecond {
		t.Fatalf("nak delay %v, want in (350ms, 700ms]", out.Delay)
	}
	wantOutcome(t, out, idemnats.Outcome{Action: idemnats.Nak, Delay: out.Delay, Ran: true, Reason: idempotency.OutcomeReleased})
	if err := f.reported(t); !errors.Is(err, declined) {
		t.Fatalf("reported %v", err)
	}

	again := f.next(t)
	if waited := time.Since(naked); waited < out.Delay-100*time.Millisecond {
		t.Fatalf("redelivered after %v, before the nak's delay %v", waited, out.Delay)
	}
	if n := delivery(t, again); n != 2 {
		t.Fatalf("delivery %d, want 2", n)
	}
	out, err = p.Process(context.Background(), again)
	if err != nil {
		t.Fatal(err)
	}
	wantOutcome(t, out, idemnats.Outcome{Action: idemnats.Ack, Ran: true, Epoch: 1, Reason: idempotency.OutcomeStored})
	f.none(t, quiet)
	wantRuns(t, &runs, 2)
}

// TestInFlightWaits: a message whose key another call holds is neither
// naked nor reported: Process keeps it on its first delivery, with
// in-progress acks past its AckWait, and acks it as a replay once the
// holder completed. When ctx ends first (the consumer stops), the message
// is naked after the backoff, without a report.
func TestInFlightWaits(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const lease = ackWait
	entered, release := make(chan string, 2), make(chan struct{})
	var runs atomic.Int64
	p := idemnats.NewProcessor(idempotency.NewRunner(newMemStore(t), idempotency.WithLease(lease)), "orders.charge",
		func(ctx context.Context, msg jetstream.Msg) (int, error) {
			runs.Add(1)
			entered <- msg.Headers().Get("Order-Id")
			<-release
			return 1, nil
		}, f.options()...)
	type result struct {
		out idemnats.Outcome
		err error
	}
	process := func(ctx context.Context, msg jetstream.Msg) chan result {
		done := make(chan result, 1)
		go func() {
			out, err := p.Process(ctx, msg)
			done <- result{out, err}
		}()
		return done
	}
	f.st.publish(t, "charge", "Order-Id", "o-1", nats.MsgIdHdr, "m-1")
	f.st.publish(t, "charge", "Order-Id", "o-1", nats.MsgIdHdr, "m-2")
	holder := process(context.Background(), f.next(t))
	<-entered
	duplicate := f.next(t)
	waiting := process(context.Background(), duplicate)

	// Past the AckWait, the waiting duplicate has not come back: its
	// in-progress acks keep it, and it was not naked.
	f.none(t, 2*ackWait)
	select {
	case r := <-waiting:
		t.Fatalf("the duplicate returned while the holder ran: %+v %v", r.out, r.err)
	default:
	}

	// A duplicate of another held key gives up when its ctx ends: a nak,
	// not reported.
	f.st.publish(t, "charge", "Order-Id", "o-2", nats.MsgIdHdr, "m-3")
	f.st.publish(t, "charge", "Order-Id", "o-2", nats.MsgIdHdr, "m-4")
	holder2 := process(context.Background(), f.next(t))
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	gaveUp := <-process(ctx, f.next(t))
	if !errors.Is(gaveUp.err, context.DeadlineExceeded) {
		t.Fatalf("error %v, want the context's", gaveUp.err)
	}
	if gaveUp.out.Action != idemnats.Nak || gaveUp.out.Delay <= 0 || gaveUp.out.Delay > lease || gaveUp.out.Ran ||
		gaveUp.out.Reason != idempotency.OutcomeCanceled || gaveUp.out.LastDelivery {
		t.Fatalf("outcome %+v, want a nak after the backoff", gaveUp.out)
	}

	f.noneReported(t)
	close(release)
	for _, done := range []chan result{holder, holder2} {
		if r := <-done; r.err != nil {
			t.Fatal(r.err)
		}
	}
	r := <-waiting
	if r.err != nil {
		t.Fatal(r.err)
	}
	wantOutcome(t, r.out, idemnats.Outcome{Action: idemnats.Ack, Replayed: true, Reason: idempotency.OutcomeReplayed})
	if n := delivery(t, duplicate); n != 1 {
		t.Fatalf("the duplicate was acked on delivery %d, want 1", n)
	}
	wantRuns(t, &runs, 2)

	// The duplicate that gave up comes back, and replays.
	again := f.next(t)
	if again.Headers().Get(nats.MsgIdHdr) != "m-4" || delivery(t, again) != 2 {
		t.Fatalf("redelivered %v, delivery %d; want m-4's second", again.Headers(), delivery(t, again))
	}
	if r := <-process(context.Background(), again); r.err != nil || !r.out.Replayed {
		t.Fatalf("redelivery: %+v %v, want a replay", r.out, r.err)
	}
	f.noneReported(t)
	wantRuns(t, &runs, 2)
}

// TestTerms: a key used with another payload, a message without a key
// and a key too long are termed, reported, and never redelivered.
func TestTerms(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var c counter
	p := idemnats.NewProcessor(idempotency.NewRunner(newMemStore(t)), "orders.charge", c.handle, f.options()...)
	f.st.publish(t, "charge 100", "Order-Id", "o-1", nats.MsgIdHdr, "m-1")
	if out, err := p.Process(context.Background(), f.next(t)); err != nil || out.Action != idemnats.Ack {
		t.Fatalf("first: %+v %v", out, err)
	}

	for _, tc := range []struct {
		name    string
		headers []string
		want    error
		reason  idempotency.Outcome
	}{
		{"other payload", []string{"Order-Id", "o-1", nats.MsgIdHdr, "m-2"}, idempotency.ErrFingerprintMismatch, idempotency.OutcomeMismatch},
		{"no key", []string{nats.MsgIdHdr, "m-3"}, idemnats.ErrNoKey, idempotency.OutcomeInvalid},
		{"key too long", []string{"Order-Id", strings.Repeat("k", idempotency.MaxKeyLen+1)}, idempotency.ErrInvalidKey, idempotency.OutcomeInvalid},
	} {
		f.st.publish(t, "charge 999", tc.headers...)
		out, err := p.Process(context.Background(), f.next(t))
		if !errors.Is(err, tc.want) || out.Action != idemnats.Term || out.Ran || out.Reason != tc.reason || out.LastDelivery {
			t.Fatalf("%s: %+v %v, want a term for %v", tc.name, out, err, tc.want)
		}
		if err := f.reported(t); !errors.Is(err, tc.want) {
			t.Fatalf("%s: reported %v", tc.name, err)
		}
	}
	f.none(t, quiet)
	wantRuns(t, &c.runs, 1)
}

// TestResultOmittedAcks: a result over the Runner's cap is not stored;
// the duplicate is acked all the same, without running the handler.
func TestResultOmittedAcks(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var runs atomic.Int64
	r := idempotency.NewRunner(newMemStore(t), idempotency.WithMaxResponseBody(8))
	p := idemnats.NewProcessor(r, "reports.build", func(ctx context.Context, msg jetstream.Msg) (string, error) {
		runs.Add(1)
		return strings.Repeat("x", 100), nil
	}, f.options()...)
	f.st.publish(t, "build", "Order-Id", "r-1", nats.MsgIdHdr, "m-1")
	f.st.publish(t, "build", "Order-Id", "r-1", nats.MsgIdHdr, "m-2")
	out, err := p.Process(context.Background(), f.next(t))
	if err != nil {
		t.Fatal(err)
	}
	wantOutcome(t, out, idemnats.Outcome{Action: idemnats.Ack, Ran: true, Epoch: 1, Reason: idempotency.OutcomeOmitted})
	out, err = p.Process(context.Background(), f.next(t))
	if err != nil {
		t.Fatal(err)
	}
	wantOutcome(t, out, idemnats.Outcome{Action: idemnats.Ack, Replayed: true, Reason: idempotency.OutcomeReplayedOmitted})
	f.none(t, quiet)
	wantRuns(t, &runs, 1)
	f.noneReported(t)
}

// failingComplete refuses every Complete: a store that failed after the
// handler ran.
type failingComplete struct{ idempotency.Store }

var errStoreDown = errors.New("store down")

func (failingComplete) Complete(context.Context, string, string, *idempotency.Response, time.Duration) error {
	return errStoreDown
}

// TestUnstoredRecordAcks: when the handler ran but its record could not be
// stored (no transaction), the message is acked, since the handler's
// effects stand, and the failure is reported.
func TestUnstoredRecordAcks(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var c counter
	r := idempotency.NewRunner(failingComplete{newMemStore(t)}, idempotency.WithLease(300*time.Millisecond))
	p := idemnats.NewProcessor(r, "orders.charge", c.handle, f.options()...)
	f.st.publish(t, "charge", "Order-Id", "o-1")
	out, err := p.Process(context.Background(), f.next(t))
	if !errors.Is(err, errStoreDown) {
		t.Fatalf("error %v, want the store's", err)
	}
	wantOutcome(t, out, idemnats.Outcome{Action: idemnats.Ack, Ran: true, Epoch: 1, Reason: idempotency.OutcomeUnrecorded})
	if err := f.reported(t); !errors.Is(err, errStoreDown) {
		t.Fatalf("reported %v", err)
	}
	f.none(t, quiet)
}

// TestStoreFullNaks: a store that refuses the record before the handler
// ran (full) naks the message after the outcome's RetryAfter, longer than
// the backoff; the handler does not run.
func TestStoreFullNaks(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var c counter
	r := idempotency.NewRunner(newMemStore(t, memstore.WithMaxEntries(1)))
	p := idemnats.NewProcessor(r, "orders.charge", c.handle, f.options()...)
	f.st.publish(t, "charge", "Order-Id", "o-1")
	f.st.publish(t, "charge", "Order-Id", "o-2")
	if out, err := p.Process(context.Background(), f.next(t)); err != nil || out.Action != idemnats.Ack {
		t.Fatalf("first: %+v %v", out, err)
	}
	out, err := p.Process(context.Background(), f.next(t))
	if !errors.Is(err, idempotency.ErrStoreFull) {
		t.Fatalf("error %v, want ErrStoreFull", err)
	}
	// The core's RetryAfter for a full store (a second) is longer than
	// the backoff's first delay (300ms at most): it wins.
	wantOutcome(t, out, idemnats.Outcome{Action: idemnats.Nak, Delay: time.Second, Reason: idempotency.OutcomeStoreFull})
	if err := f.reported(t); !errors.Is(err, idempotency.ErrStoreFull) {
		t.Fatalf("reported %v", err)
	}
	if again := f.next(t); delivery(t, again) != 2 || again.Headers().Get("Order-Id") != "o-2" {
		t.Fatalf("redelivered %v, delivery %d; want o-2's second", again.Headers(), delivery(t, again))
	}
	wantRuns(t, &c.runs, 1)
}

// TestPanicNaks: a panicking handler's key is released and its message
// naked, and the panic goes on; the redelivery runs the handler.
func TestPanicNaks(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var runs atomic.Int64
	p := idemnats.NewProcessor(idempotency.NewRunner(newMemStore(t)), "orders.charge",
		func(ctx context.Context, msg jetstream.Msg) (int, error) {
			if runs.Add(1) == 1 {
				panic("boom")
			}
			return 1, nil
		}, f.options()...)
	f.st.publish(t, "charge", "Order-Id", "o-1")
	func() {
		defer func() {
			if v := recover(); v != "boom" {
				t.Fatalf("recovered %v, want the handler's panic", v)
			}
		}()
		p.Process(context.Background(), f.next(t))
	}()
	if err := f.reported(t); !strings.Contains(err.Error(), "panicked") {
		t.Fatalf("reported %v", err)
	}
	out, err := p.Process(context.Background(), f.next(t))
	if err != nil {
		t.Fatal(err)
	}
	wantOutcome(t, out, idemnats.Outcome{Action: idemnats.Ack, Ran: true, Epoch: 1, Reason: idempotency.OutcomeStored})
}

// TestDefaultKey: without options a message is keyed by its Nats-Msg-Id
// header, or else by its stream, stream sequence and stored timestamp,
// which its redeliveries share.
func TestDefaultKey(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var keys []string
	var failed bool
	p := idemnats.NewProcessor(idempotency.NewRunner(newMemStore(t)), "orders.charge",
		func(ctx context.Context, msg jetstream.Msg) (int, error) {
			info, _ := idempotency.FromContext(ctx)
			keys = append(keys, info.Key)
			if string(msg.Data()) == "b" && !failed {
				failed = true
				return 0, errors.New("once")
			}
			return 1, nil
		}, idemnats.WithNakDelay(time.Millisecond), idemnats.WithErrorHandler(func(context.Context, jetstream.Msg, error) {}))
	f.st.publish(t, "a", nats.MsgIdHdr, "m-1")
	f.st.publish(t, "b")
	var stored time.Time
	for range 3 { // m-1, the second message, which fails, and its redelivery
		msg := f.next(t)
		if meta, err := msg.Metadata(); err == nil && meta.Sequence.Stream == 2 {
			stored = meta.Timestamp
		}
		if _, err := p.Process(context.Background(), msg); err != nil && err.Error() != "idemnats: nak: once" {
			t.Fatal(err)
		}
	}
	second := fmt.Sprintf("%s:2:%d", f.st.name, stored.UnixNano())
	want := []string{"m-1", second, second}
	if fmt.Sprint(keys) != fmt.Sprint(want) {
		t.Fatalf("keys %q, want %q", keys, want)
	}
}

// TestTransactionNaks: on a transactional Runner (pgstore), a run whose
// writes were not committed (a commit whose connection died) naks the
// message, and its redelivery commits the handler's writes once. A result
// over the cap commits with the writes, marked omitted, and is acked.
func TestTransactionNaks(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	store, pool := newPGStore(t, pgDatabase(t))
	r := idempotency.NewRunner(store, idempotency.WithTransaction(true), idempotency.WithMaxResponseBody(64))
	var runs atomic.Int64
	p := idemnats.NewProcessor(r, "orders.charge", func(ctx context.Context, msg jetstream.Msg) (string, error) {
		tx, _ := pgstore.TxFromContext(ctx)
		info, _ := idempotency.FromContext(ctx)
		if _, err := tx.Exec(ctx, "INSERT INTO effects VALUES ($1, $2, 0)", info.Key, info.Epoch); err != nil {
			return "", err
		}
		if runs.Add(1) == 1 { // the connection dies before the commit
			_, _ = tx.Exec(ctx, "SELECT pg_terminate_backend(pg_backend_pid())")
		}
		if info.Key == "o-2" { // over the cap
			return strings.Repeat("x", 100), nil
		}
		return "ok", nil
	}, f.options()...)
	rows := func(key string) int {
		var n int
		if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM effects WHERE key = $1", key).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	f.st.publish(t, "charge", "Order-Id", "o-1")

	out, err := p.Process(context.Background(), f.next(t))
	if err == nil || out.Action != idemnats.Nak || !out.Ran || out.Epoch != 0 || out.Reason.Class() != idempotency.ClassRetry || rows("o-1") != 0 {
		t.Fatalf("connection died: %+v %v, %d rows", out, err, rows("o-1"))
	}
	if err := f.reported(t); err == nil {
		t.Fatal("nothing reported")
	}
	out, err = p.Process(context.Background(), f.next(t))
	if err != nil || out.Action != idemnats.Ack || !out.Ran || out.Reason != idempotency.OutcomeCommitted || rows("o-1") != 1 {
		t.Fatalf("redelivery: %+v %v, %d rows", out, err, rows("o-1"))
	}

	f.st.publish(t, "charge", "Order-Id", "o-2")
	out, err = p.Process(context.Background(), f.next(t))
	if err != nil || out.Action != idemnats.Ack || out.Reason != idempotency.OutcomeOmitted || rows("o-2") != 1 {
		t.Fatalf("over the cap: %+v %v, %d rows", out, err, rows("o-2"))
	}
	f.none(t, quiet)
	f.noneReported(t)
}

// deliveries counts the deliveries a Processor saw (through its key
// function, which is called for each) and the runs of its handler.
type deliveries struct {
	mu        sync.Mutex
	delivered map[string]int
	runs      atomic.Int64
	entered   chan struct{}
}

func (d *deliveries) key(msg jetstream.Msg) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.delivered == nil {
		d.delivered = map[string]int{}
	}
	d.delivered[msg.Headers().Get(nats.MsgIdHdr)]++
	return msg.Headers().Get("Order-Id"), nil
}

func (d *deliveries) count(id string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.delivered[id]
}

// consume runs p.Consume on cons until t ends, failing t when it returns
// an error.
func consume[T any](t *testing.T, p *idemnats.Processor[T], cons jetstream.Consumer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Consume(ctx, cons, jetstream.PullMaxMessages(1)) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Consume: %v", err)
		}
	})
}

// waitAcked waits until the consumer has no message pending or delivered
// unacknowledged, failing t after a few seconds.
func (f *fixture) waitAcked(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := f.cons.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if info.NumAckPending == 0 && info.NumPending == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d messages unacknowledged, %d pending", info.NumAckPending, info.NumPending)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// longRun is a handler that works three times the AckWait, counting its
// runs and closing d.entered when the first starts.
func (d *deliveries) longRun(ctx context.Context, msg jetstream.Msg) (int, error) {
	if d.runs.Add(1) == 1 {
		close(d.entered)
	}
	select {
	case <-time.After(3 * ackWait): // the work
	case <-ctx.Done():
		return 0, context.Cause(ctx)
	}
	return 1, nil
}

// consumeLong runs n Consume loops of Processors on r with d's key and
// handler.
func (f *fixture) consumeLong(t *testing.T, r *idempotency.Runner, d *deliveries, n int) {
	t.Helper()
	for range n {
		consume(t, idemnats.NewProcessor(r, "reports.build", d.longRun, idemnats.WithKey(d.key), f.collect()), f.cons)
	}
}

// TestInProgressKeepsLongHandler: a handler that runs three times the
// consumer's AckWait, under a lease as short, keeps its message: Consume
// takes the AckWait from the consumer (the default, 30s, would send no
// in-progress ack in time) and sends in-progress acks, so the message is
// neither redelivered to the other, idle consumer nor run twice.
func TestInProgressKeepsLongHandler(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := &deliveries{entered: make(chan struct{})}
	f.consumeLong(t, idempotency.NewRunner(newMemStore(t), idempotency.WithLease(ackWait)), d, 2)
	f.st.publish(t, "build", "Order-Id", "r-1", nats.MsgIdHdr, "m-1")
	<-d.entered
	f.waitAcked(t)
	if n, runs := d.count("m-1"), d.runs.Load(); n != 1 || runs != 1 {
		t.Fatalf("%d deliveries and %d runs, want 1 and 1", n, runs)
	}
	f.noneReported(t)
}

// TestWaitModeKeepsDuplicate: in wait mode, a duplicate waits in Do for the
// running handler, with in-progress acks, past its own AckWait, and is
// then acked as a replay. Two consumers are busy with the two messages,
// the third, idle, would get a redelivery.
func TestWaitModeKeepsDuplicate(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := &deliveries{entered: make(chan struct{})}
	r := idempotency.NewRunner(newMemStore(t), idempotency.WithLease(ackWait), idempotency.WithWait(10*ackWait))
	f.consumeLong(t, r, d, 3)
	f.st.publish(t, "build", "Order-Id", "r-1", nats.MsgIdHdr, "m-1")
	<-d.entered
	f.st.publish(t, "build", "Order-Id", "r-1", nats.MsgIdHdr, "m-2")
	f.waitAcked(t)
	if d.count("m-1") != 1 || d.count("m-2") != 1 || d.runs.Load() != 1 {
		t.Fatalf("deliveries m-1 %d, m-2 %d, runs %d; want 1, 1, 1", d.count("m-1"), d.count("m-2"), d.runs.Load())
	}
	f.noneReported(t)
}

// TestConsumeEnds: Consume returns nil when its context ends, and
// ErrConsumerStopped, with a report, when the consumer is deleted.
func TestConsumeEnds(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var c counter
	p := idemnats.NewProcessor(idempotency.NewRunner(newMemStore(t)), "orders.charge", c.handle, f.options()...)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Consume(ctx, f.cons) }()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("after cancel: %v", err)
	}

	go func() { done <- p.Consume(context.Background(), f.cons) }()
	f.st.publish(t, "charge", "Order-Id", "o-1")
	f.waitAcked(t) // consuming
	if err := f.st.js.DeleteConsumer(context.Background(), f.st.name, "worker"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, idemnats.ErrConsumerStopped) {
			t.Fatalf("after the consumer was deleted: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Consume went on after its consumer was deleted")
	}
	if err := f.reported(t); !strings.Contains(err.Error(), "consume") {
		t.Fatalf("reported %v", err)
	}
	wantRuns(t, &c.runs, 1)
}

// TestMisconfiguration: a Processor misconfigured panics at construction.
func TestMisconfiguration(t *testing.T) {
	r := idempotency.NewRunner(newMemStore(t))
	var c counter
	for name, f := range map[string]func(){
		"nil Runner":   func() { idemnats.NewProcessor(nil, "n", c.handle) },
		"no name":      func() { idemnats.NewProcessor(r, "", c.handle) },
		"nil handler":  func() { idemnats.NewProcessor[int](r, "n", nil) },
		"nil option":   func() { idemnats.NewProcessor(r, "n", c.handle, nil) },
		"nil key":      func() { idemnats.WithKey(nil) },
		"nil scope":    func() { idemnats.WithScope(nil) },
		"nil payload":  func() { idemnats.WithPayload(nil) },
		"zero AckWait": func() { idemnats.WithAckWait(0) },
		"negative nak": func() { idemnats.WithNakDelay(-time.Second) },
		"zero nak":     func() { idemnats.WithNakDelay(0) },
		"zero max nak": func() { idemnats.WithMaxNakDelay(0) },
		"nil conn":     func() { idemnats.WithConn(nil) },
		"nil handler2": func() { idemnats.WithErrorHandler(nil) },
		"empty header": func() { idemnats.HeaderKey("") },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s did not panic", name)
				}
			}()
			f()
		}()
	}
}
