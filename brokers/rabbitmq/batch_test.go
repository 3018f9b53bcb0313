package idemrabbit_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	idemrabbit "github.com/go-idempotency/idempotency/brokers/rabbitmq"
	"github.com/go-idempotency/idempotency/brokers/rabbitmq/rabbittest"
	"github.com/go-idempotency/idempotency/outbox"
)

// batchOf returns n envelopes k/1..k/n to queue.
func batchOf(k string, n int, queue string) []outbox.Envelope {
	es := make([]outbox.Envelope, n)
	for i := range es {
		es[i] = envelope(fmt.Sprint(k, "/", i+1), queue, fmt.Sprint("payload ", i+1))
	}
	return es
}

// collector gathers the message IDs a queue delivers, acking each.
type collector struct {
	mu      sync.Mutex
	seen    map[string]int
	order   []string
	reached chan struct{} // closed once trigger deliveries came
	trigger int
}

// collect consumes queue on a connection of its own until t ends; the
// channel of the collector returned is closed at the trigger-th delivery
// (0: never).
func collect(t testing.TB, queue string, trigger int) *collector {
	t.Helper()
	c := &collector{seen: map[string]int{}, reached: make(chan struct{}), trigger: trigger}
	ds := consume(t, queue)
	go func() {
		for d := range ds {
			c.mu.Lock()
			c.seen[d.MessageId]++
			c.order = append(c.order, d.MessageId)
			if len(c.order) == c.trigger {
				close(c.reached)
			}
			c.mu.Unlock()
			_ = d.Ack(false)
		}
	}()
	return c
}

// await waits until the collector has seen each of ids, failing t after
// 20s.
func (c *collector) await(t testing.TB, ids ...string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; {
		c.mu.Lock()
		missing := ""
		for _, id := range ids {
			if c.seen[id] == 0 {
				missing = id
				break
			}
		}
		c.mu.Unlock()
		if missing == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not delivered within 20s", missing)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (c *collector) deliveries() (map[string]int, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := make(map[string]int, len(c.seen))
	for k, v := range c.seen {
		seen[k] = v
	}
	return seen, append([]string(nil), c.order...)
}

func ids(es []outbox.Envelope) []string {
	s := make([]string, len(es))
	for i, e := range es {
		s[i] = e.ID
	}
	return s
}

// TestPublishBatch: a batch larger than the window is confirmed; the
// queue gets each message once, in the order of the batch, as Publish
// publishes it.
func TestPublishBatch(t *testing.T) {
	queue := rabbittest.Queue(t)
	sink := newSink(t, idemrabbit.WithChannels(1))
	es := batchOf("b1", 2*idemrabbit.DefaultWindow+88, queue)
	es[3].Headers = map[string]string{"Payment-Id": "pay_4"}
	errs := sink.PublishBatch(context.Background(), es)
	if len(errs) != len(es) {
		t.Fatalf("%d errors for %d envelopes", len(errs), len(es))
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s: %v", es[i].ID, err)
		}
	}
	ds := consume(t, queue)
	for i, e := range es {
		d := next(t, ds)
		if d.MessageId != e.ID || string(d.Body) != string(e.Payload) || d.DeliveryMode != amqp.Persistent {
			t.Fatalf("delivery %d: %q %q mode %d, want %s %q persistent", i+1, d.MessageId, d.Body, d.DeliveryMode, e.ID, e.Payload)
		}
		if i == 3 && d.Headers["Payment-Id"] != "pay_4" {
			t.Fatalf("delivery 4: headers %v", d.Headers)
		}
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
	}
	if errs := sink.PublishBatch(context.Background(), nil); len(errs) != 0 {
		t.Fatalf("an empty batch: %v", errs)
	}
}

// TestPublishBatchUnroutable: the messages no queue takes, among routable
// ones, are returned, and exactly their envelopes get ErrUnroutable; the
// others are confirmed and delivered, and the sink goes on publishing.
func TestPublishBatchUnroutable(t *testing.T) {
	queue := rabbittest.Queue(t)
	sink := newSink(t, idemrabbit.WithChannels(1))
	es := batchOf("b2", 300, queue)
	var routable []outbox.Envelope
	for i := range es {
		if i%7 == 2 || i == len(es)-1 {
			es[i].Topic = queue + ".nobody"
		} else {
			routable = append(routable, es[i])
		}
	}
	errs := sink.PublishBatch(context.Background(), es)
	for i, err := range errs {
		if es[i].Topic == queue {
			if err != nil {
				t.Errorf("%s: %v", es[i].ID, err)
			}
		} else if !errors.Is(err, idemrabbit.ErrUnroutable) || !strings.Contains(err.Error(), es[i].ID) {
			t.Errorf("%s to no queue: %v", es[i].ID, err)
		}
	}
	after := envelope("b2/after", queue, "p")
	if err := sink.Publish(context.Background(), after); err != nil {
		t.Fatal(err)
	}
	c := collect(t, queue, 0)
	c.await(t, append(ids(routable), after.ID)...)
	seen, order := c.deliveries()
	if len(order) != len(routable)+1 {
		t.Fatalf("%d deliveries, want the %d routable messages and one more", len(order), len(routable)+1)
	}
	for _, e := range routable {
		if seen[e.ID] != 1 {
			t.Fatalf("%s delivered %d times", e.ID, seen[e.ID])
		}
	}
}

// TestPublishBatchNoSuchExchange: the broker closes the channel of a
// batch to an exchange that does not exist: every envelope gets an error,
// and the next batch does too, on another channel.
func TestPublishBatchNoSuchExchange(t *testing.T) {
	rabbittest.URL(t)
	sink := newSink(t, idemrabbit.WithExchange("idemtest.no-such-exchange"), idemrabbit.WithChannels(1))
	for round := range 2 {
		for i, err := range sink.PublishBatch(context.Background(), batchOf(fmt.Sprint("b3-", round), 50, "q")) {
			if err == nil {
				t.Fatalf("round %d, envelope %d confirmed", round+1, i+1)
			}
		}
	}
}

// cuttable dials the broker and hands each connection it made to conns,
// so that a test can cut it.
func cuttable(conns chan<- net.Conn) amqp.Config {
	dial := amqp.DefaultDial(5 * time.Second)
	return amqp.Config{Dial: func(network, addr string) (net.Conn, error) {
		c, err := dial(network, addr)
		if err == nil {
			select {
			case conns <- c:
			default:
			}
		}
		return c, err
	}}
}

// TestPublishBatchConnectionCut: the sink's connection is cut while a
// batch is under way. Every envelope gets nil or an error, and none is
// lost: each confirmed one is in the queue, and the envelopes with errors,
// published again (the sink dials again), are delivered, at least once.
func TestPublishBatchConnectionCut(t *testing.T) {
	queue := rabbittest.Queue(t)
	conns := make(chan net.Conn, 4)
	sink := newSink(t, idemrabbit.WithChannels(1), idemrabbit.WithConfig(cuttable(conns)))
	es := batchOf("b4", 5000, queue)
	c := collect(t, queue, 300)
	cut := make(chan struct{})
	go func() {
		defer close(cut)
		select {
		case <-c.reached:
			(<-conns).Close()
		case <-time.After(30 * time.Second):
		}
	}()
	errs := sink.PublishBatch(context.Background(), es)
	<-cut
	var confirmed, failed []outbox.Envelope
	for i, err := range errs {
		if err == nil {
			confirmed = append(confirmed, es[i])
		} else {
			failed = append(failed, es[i])
		}
	}
	t.Logf("cut after 300 deliveries: %d confirmed, %d failed", len(confirmed), len(failed))
	if len(confirmed) < 300-idemrabbit.DefaultWindow || len(failed) == 0 {
		t.Fatalf("%d confirmed and %d failed, want a cut mid-batch", len(confirmed), len(failed))
	}
	for i, err := range sink.PublishBatch(context.Background(), failed) {
		if err != nil {
			t.Fatalf("%s published again: %v", failed[i].ID, err)
		}
	}
	c.await(t, ids(es)...)
	seen, order := c.deliveries()
	if len(order) > len(es)+len(failed) {
		t.Fatalf("%d deliveries, more than the %d publications", len(order), len(es)+len(failed))
	}
	for _, e := range confirmed {
		if seen[e.ID] != 1 {
			t.Fatalf("%s, confirmed before the cut, delivered %d times", e.ID, seen[e.ID])
		}
	}
}

// TestPublishBatchContextEnds: once ctx ends, the envelopes not sent are
// not, and their errors carry ctx's cause; every envelope confirmed is in
// the queue.
func TestPublishBatchContextEnds(t *testing.T) {
	queue := rabbittest.Queue(t)
	sink := newSink(t, idemrabbit.WithChannels(1))
	es := batchOf("b5", 5000, queue)
	c := collect(t, queue, 100)
	stopping := errors.New("the relay is stopping")
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() {
		select {
		case <-c.reached:
			cancel(stopping)
		case <-time.After(30 * time.Second):
		}
	}()
	errs := sink.PublishBatch(ctx, es)
	var confirmed []outbox.Envelope
	var unsent int
	for i, err := range errs {
		switch {
		case err == nil:
			confirmed = append(confirmed, es[i])
		case !errors.Is(err, stopping):
			t.Errorf("%s: %v, want nil or ctx's cause", es[i].ID, err)
		case strings.Contains(err.Error(), "not published"):
			unsent++
		}
	}
	if len(confirmed) == 0 || unsent == 0 {
		t.Fatalf("%d confirmed and %d not sent, want ctx to end mid-batch", len(confirmed), unsent)
	}
	c.await(t, ids(confirmed)...)
	// The sink publishes on after a batch whose ctx ended.
	if err := sink.Publish(context.Background(), envelope("b5/after", queue, "p")); err != nil {
		t.Fatal(err)
	}
	c.await(t, "b5/after")
	seen, _ := c.deliveries()
	sent := 0
	for _, e := range es {
		sent += seen[e.ID]
	}
	if sent > len(es)-unsent {
		t.Fatalf("%d of the batch delivered, but %d were not sent", sent, unsent)
	}
}
