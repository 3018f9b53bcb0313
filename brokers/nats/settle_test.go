package idemnats_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/go-idempotency/idempotency"
	idemnats "github.com/go-idempotency/idempotency/brokers/nats"
)

// newFixtureWith returns a fixture whose consumer, "worker", has the
// configuration cfg (explicit acks; the AckWait of the tests unless cfg
// says otherwise), and the connection it is on.
func newFixtureWith(t *testing.T, cfg jetstream.ConsumerConfig) (*fixture, *nats.Conn) {
	t.Helper()
	nc, js := connect(t, natsURL(t))
	st := newStream(t, js)
	cfg.Durable, cfg.AckPolicy, cfg.MaxAckPending = "worker", jetstream.AckExplicitPolicy, 10_000
	if cfg.AckWait == 0 {
		cfg.AckWait = ackWait
	}
	cons, err := js.CreateOrUpdateConsumer(context.Background(), st.name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{st: st, cons: cons, errs: make(chan error, 100)}, nc
}

// terminations returns the deliveries counts of the terms the server
// honoured on the stream's consumer "worker", from its advisories.
func terminations(t *testing.T, nc *nats.Conn, st *stream) <-chan uint64 {
	t.Helper()
	terms := make(chan uint64, 10)
	sub, err := nc.Subscribe("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED."+st.name+".worker", func(m *nats.Msg) {
		var adv struct {
			Deliveries uint64 `json:"deliveries"`
		}
		if err := json.Unmarshal(m.Data, &adv); err != nil {
			t.Errorf("advisory %s: %v", m.Data, err)
		}
		terms <- adv.Deliveries
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return terms
}

// wantTermination fails t unless the server honoured a term on the
// delivery want of a message.
func wantTermination(t *testing.T, terms <-chan uint64, want uint64) {
	t.Helper()
	select {
	case n := <-terms:
		if n != want {
			t.Fatalf("termed on delivery %d, want %d", n, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the server terminated no message")
	}
}

// drain returns the errors reported so far.
func (f *fixture) drain() []error {
	var errs []error
	for {
		select {
		case err := <-f.errs:
			errs = append(errs, err)
		default:
			return errs
		}
	}
}

// TestInFlightDuplicateKeepsBudget: duplicates that find their key held by
// a handler slower than several of their AckWaits keep their messages,
// without spending their consumer's small MaxDeliver; when the holder then
// fails, the key still runs to success, and every message is acked, none
// near its last delivery.
func TestInFlightDuplicateKeepsBudget(t *testing.T) {
	t.Parallel()
	const maxDeliver = 3
	f, _ := newFixtureWith(t, jetstream.ConsumerConfig{MaxDeliver: maxDeliver})
	var (
		mu        sync.Mutex
		delivered = map[string]uint64{} // the highest delivery of each message
		exhausted = make(chan struct{}) // a duplicate met its last delivery
		once      sync.Once
		holding   = make(chan struct{})
		runs      atomic.Int64
	)
	errHolder := errors.New("the holder failed")
	key := func(msg jetstream.Msg) (string, error) {
		meta, err := msg.Metadata()
		if err != nil {
			return "", err
		}
		id := msg.Headers().Get(nats.MsgIdHdr)
		mu.Lock()
		delivered[id] = max(delivered[id], meta.NumDelivered)
		if id != "m-1" && meta.NumDelivered == maxDeliver {
			once.Do(func() { close(exhausted) })
		}
		mu.Unlock()
		return msg.Headers().Get("Order-Id"), nil
	}
	handle := func(ctx context.Context, msg jetstream.Msg) (string, error) {
		if runs.Add(1) > 1 {
			return "charged", nil
		}
		close(holding)
		select { // slower than several of the duplicates' AckWaits
		case <-time.After(3 * ackWait):
		case <-exhausted: // no need to wait longer: the duplicates ran out
		}
		return "", errHolder
	}
	r := idempotency.NewRunner(newMemStore(t), idempotency.WithLease(300*time.Millisecond))
	for range 3 {
		consume(t, idemnats.NewProcessor(r, "orders.charge", handle, f.options(idemnats.WithKey(key))...), f.cons)
	}
	f.st.publish(t, "charge", "Order-Id", "o-1", nats.MsgIdHdr, "m-1")
	<-holding
	f.st.publish(t, "charge", "Order-Id", "o-1", nats.MsgIdHdr, "m-2")
	f.st.publish(t, "charge", "Order-Id", "o-1", nats.MsgIdHdr, "m-3")
	f.waitAcked(t)

	mu.Lock()
	defer mu.Unlock()
	// A duplicate may be delivered twice when it waited in the client's
	// buffer behind the holder past its AckWait; never more.
	for _, id := range []string{"m-1", "m-2", "m-3"} {
		if n := delivered[id]; n == 0 || n >= maxDeliver {
			t.Errorf("%s was delivered %d times, MaxDeliver %d", id, n, maxDeliver)
		}
	}
	t.Logf("deliveries: %v", delivered)
	wantRuns(t, &runs, 2) // the holder's failure, and one success
	errs := f.drain()
	if len(errs) != 1 || !errors.Is(errs[0], errHolder) {
		t.Fatalf("reported %v, want the holder's failure alone", errs)
	}
}

// TestLastDeliveryTerms: a handler that always fails, on a consumer with
// MaxDeliver 3, runs exactly three times: the first two deliveries are
// naked, the third, which the server would not deliver again, is termed
// (a plain term, which this server honours), reported once with
// ErrLastDelivery, and marked LastDelivery; nothing comes back. Process
// learns MaxDeliver from WithMaxDeliver, Consume from the consumer.
func TestLastDeliveryTerms(t *testing.T) {
	t.Parallel()
	declined := errors.New("card declined")
	failing := func(runs *atomic.Int64) func(context.Context, jetstream.Msg) (int, error) {
		return func(context.Context, jetstream.Msg) (int, error) {
			runs.Add(1)
			return 0, declined
		}
	}
	wantFinal := func(t *testing.T, errs []error) {
		t.Helper()
		finals := 0
		for _, err := range errs {
			if !errors.Is(err, declined) {
				t.Errorf("reported %v, want the handler's error", err)
			}
			if errors.Is(err, idemnats.ErrLastDelivery) {
				finals++
			}
		}
		if len(errs) != 3 || finals != 1 || !errors.Is(errs[len(errs)-1], idemnats.ErrLastDelivery) {
			t.Fatalf("reported %q, want 3 errors, the last one final", errs)
		}
	}

	t.Run("Process", func(t *testing.T) {
		t.Parallel()
		f, nc := newFixtureWith(t, jetstream.ConsumerConfig{MaxDeliver: 3})
		terms := terminations(t, nc, f.st)
		var runs atomic.Int64
		p := idemnats.NewProcessor(idempotency.NewRunner(newMemStore(t)), "orders.charge", failing(&runs),
			f.options(idemnats.WithNakDelay(20*time.Millisecond), idemnats.WithMaxDeliver(3), idemnats.WithConn(nc))...)
		f.st.publish(t, "charge", "Order-Id", "o-1")
		for n := uint64(1); n <= 3; n++ {
			msg := f.next(t)
			if d := delivery(t, msg); d != n {
				t.Fatalf("delivery %d, want %d", d, n)
			}
			out, err := p.Process(context.Background(), msg)
			if !errors.Is(err, declined) || !out.Ran || out.Reason != idempotency.OutcomeReleased {
				t.Fatalf("delivery %d: %+v %v", n, out, err)
			}
			switch final := errors.Is(err, idemnats.ErrLastDelivery); {
			case n < 3 && (out.Action != idemnats.Nak || out.LastDelivery || final):
				t.Fatalf("delivery %d: %+v %v, want a nak", n, out, err)
			case n == 3 && (out.Action != idemnats.Term || !out.LastDelivery || !final || out.Delay != 0):
				t.Fatalf("delivery %d: %+v %v, want a term on the last delivery", n, out, err)
			}
		}
		wantTermination(t, terms, 3)
		f.none(t, quiet)
		wantRuns(t, &runs, 3)
		wantFinal(t, f.drain())
	})

	t.Run("Consume", func(t *testing.T) {
		t.Parallel()
		f, nc := newFixtureWith(t, jetstream.ConsumerConfig{MaxDeliver: 3})
		terms := terminations(t, nc, f.st)
		var runs atomic.Int64
		p := idemnats.NewProcessor(idempotency.NewRunner(newMemStore(t)), "orders.charge", failing(&runs),
			f.options(idemnats.WithNakDelay(20*time.Millisecond))...)
		consume(t, p, f.cons)
		f.st.publish(t, "charge", "Order-Id", "o-1")
		wantTermination(t, terms, 3)
		f.waitAcked(t)
		wantRuns(t, &runs, 3)
		wantFinal(t, f.drain())
	})
}

// TestNakBackoffGrows: on a consumer without MaxDeliver, a handler that
// always fails is naked with a delay that grows with each delivery, from
// the base to the limit, and never passes it; no delivery is the last.
func TestNakBackoffGrows(t *testing.T) {
	t.Parallel()
	f, _ := newFixtureWith(t, jetstream.ConsumerConfig{MaxDeliver: -1})
	const base, limit = 10 * time.Millisecond, 80 * time.Millisecond
	var runs atomic.Int64
	p := idemnats.NewProcessor(idempotency.NewRunner(newMemStore(t)), "orders.charge",
		func(context.Context, jetstream.Msg) (int, error) {
			runs.Add(1)
			return 0, errors.New("poison")
		}, f.options(idemnats.WithNakDelay(base), idemnats.WithMaxNakDelay(limit))...)
	f.st.publish(t, "poison", "Order-Id", "o-1")
	var delays []time.Duration
	full := base
	for n := uint64(1); n <= 7; n++ {
		msg := f.next(t)
		if d := delivery(t, msg); d != n {
			t.Fatalf("delivery %d, want %d", d, n)
		}
		out, _ := p.Process(context.Background(), msg)
		if out.Action != idemnats.Nak || out.LastDelivery {
			t.Fatalf("delivery %d: %+v, want a nak", n, out)
		}
		if out.Delay <= full/2 || out.Delay > full {
			t.Fatalf("delivery %d: nak delay %v, want in (%v, %v]; delays so far %v", n, out.Delay, full/2, full, delays)
		}
		if len(delays) > 0 && full < limit && out.Delay <= delays[len(delays)-1] {
			t.Fatalf("delays %v then %v: not growing", delays, out.Delay)
		}
		delays = append(delays, out.Delay)
		full = min(2*full, limit)
	}
	wantRuns(t, &runs, 7)
	t.Logf("nak delays: %v", delays)
}

// TestDefaultKeyAcrossStreamReset: messages without Nats-Msg-Id, keyed by
// default, all run after their stream was deleted and created again, even
// with the sequences and bodies of the old stream's messages.
func TestDefaultKeyAcrossStreamReset(t *testing.T) {
	t.Parallel()
	_, js := connect(t, natsURL(t))
	st := newStream(t, js)
	var runs atomic.Int64
	errs := make(chan error, 100)
	p := idemnats.NewProcessor(idempotency.NewRunner(newMemStore(t)), "orders.charge",
		func(context.Context, jetstream.Msg) (int64, error) { return runs.Add(1), nil },
		idemnats.WithAckWait(ackWait), idemnats.WithErrorHandler(func(_ context.Context, _ jetstream.Msg, err error) { errs <- err }))
	for round := 1; round <= 2; round++ {
		if round == 2 {
			if err := js.DeleteStream(context.Background(), st.name); err != nil {
				t.Fatal(err)
			}
			if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: st.name, Subjects: []string{st.subject}}); err != nil {
				t.Fatal(err)
			}
		}
		f := &fixture{st: st, cons: st.consumer(t, "worker", ackWait), errs: errs}
		for i := range 6 {
			st.publish(t, fmt.Sprint("charge ", i))
		}
		for i := range 6 {
			out, err := p.Process(context.Background(), f.next(t))
			if err != nil || out.Action != idemnats.Ack || !out.Ran {
				t.Fatalf("round %d, message %d: %+v %v, want a run", round, i+1, out, err)
			}
		}
	}
	if n := runs.Load(); n != 12 {
		t.Fatalf("%d runs for 12 messages", n)
	}
}

// TestMsgIDKey: MsgIDKey takes the key its producer chose, and terms a
// message without one, reported, without running the handler.
func TestMsgIDKey(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var c counter
	p := idemnats.NewProcessor(idempotency.NewRunner(newMemStore(t)), "orders.charge", c.handle,
		f.options(idemnats.WithKey(idemnats.MsgIDKey))...)
	f.st.publish(t, "charge", nats.MsgIdHdr, "m-1")
	f.st.publish(t, "charge")
	out, err := p.Process(context.Background(), f.next(t))
	if err != nil {
		t.Fatal(err)
	}
	wantOutcome(t, out, idemnats.Outcome{Action: idemnats.Ack, Ran: true, Epoch: 1, Reason: idempotency.OutcomeStored})
	out, err = p.Process(context.Background(), f.next(t))
	if !errors.Is(err, idemnats.ErrNoKey) {
		t.Fatalf("error %v, want ErrNoKey", err)
	}
	wantOutcome(t, out, idemnats.Outcome{Action: idemnats.Term, Reason: idempotency.OutcomeInvalid})
	if err := f.reported(t); !errors.Is(err, idemnats.ErrNoKey) {
		t.Fatalf("reported %v", err)
	}
	f.none(t, quiet)
	wantRuns(t, &c.runs, 1)
}
