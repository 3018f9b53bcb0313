package natsink_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/go-idempotency/idempotency/brokers/nats/natsink"
	"github.com/go-idempotency/idempotency/brokers/nats/natstest"
	"github.com/go-idempotency/idempotency/outbox"
)

// batchOf returns n envelopes k/1..k/n on subject.
func batchOf(k string, n int, subject string) []outbox.Envelope {
	es := make([]outbox.Envelope, n)
	for i := range es {
		es[i] = envelope(fmt.Sprint(k, "/", i+1), subject, fmt.Sprint("payload ", i+1))
	}
	return es
}

// storedIDs returns how many times the stream holds each Nats-Msg-Id.
func storedIDs(t testing.TB, js jetstream.JetStream, stream string) map[string]int {
	t.Helper()
	st, err := js.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]int{}
	for seq := uint64(1); seq <= st.CachedInfo().State.LastSeq; seq++ {
		msg, err := st.GetMsg(context.Background(), seq)
		if err != nil {
			t.Fatalf("message %d: %v", seq, err)
		}
		ids[msg.Header.Get(jetstream.MsgIDHeader)]++
	}
	return ids
}

// stall subscribes to subject, which no stream captures, on a connection
// of its own: a publication to it is received and never acknowledged, as
// by a stream that stalls. The channel returned gets a value when the
// first publication arrives.
func stall(t testing.TB, url, subject string) <-chan struct{} {
	t.Helper()
	return arrival(t, url, subject, func(*nats.Msg) bool { return true })
}

// reached returns a channel that gets a value when a message on subject
// with the Nats-Msg-Id id arrives at the server: its publisher had sent
// it.
func reached(t testing.TB, url, subject, id string) <-chan struct{} {
	t.Helper()
	return arrival(t, url, subject, func(m *nats.Msg) bool { return m.Header.Get(jetstream.MsgIDHeader) == id })
}

// arrival subscribes to subject on a connection of its own. The channel
// returned gets a value when the first message that match accepts
// arrives.
func arrival(t testing.TB, url, subject string, match func(*nats.Msg) bool) <-chan struct{} {
	t.Helper()
	nc, _ := natstest.Connect(t, url)
	arrived := make(chan struct{})
	var once sync.Once
	if _, err := nc.Subscribe(subject, func(m *nats.Msg) {
		if match(m) {
			once.Do(func() { close(arrived) })
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return arrived
}

// TestPublishBatch: a batch of 1,000 is confirmed, each message stored
// once under its ID with its payload and headers; the same batch again is
// confirmed as duplicates and stores nothing more.
func TestPublishBatch(t *testing.T) {
	_, js := natstest.Connect(t, natstest.URL(t))
	stream, prefix := newStream(t, js, 0)
	sink := natsink.New(js, natsink.WithStream(stream))
	es := batchOf("b1", 1000, prefix+"payment.created")
	es[7].Headers = map[string]string{"Payment-Id": "pay_8"}
	for round := range 2 {
		errs := sink.PublishBatch(context.Background(), es)
		if len(errs) != len(es) {
			t.Fatalf("%d errors for %d envelopes", len(errs), len(es))
		}
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, %s: %v", round+1, es[i].ID, err)
			}
		}
	}
	ids := storedIDs(t, js, stream)
	if len(ids) != len(es) {
		t.Fatalf("the stream holds %d IDs, want %d", len(ids), len(es))
	}
	for _, e := range es {
		if ids[e.ID] != 1 {
			t.Fatalf("%s stored %d times, want once", e.ID, ids[e.ID])
		}
	}
	st, err := js.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := st.GetMsg(context.Background(), 8)
	if err != nil {
		t.Fatal(err)
	}
	if msg.Header.Get(jetstream.MsgIDHeader) != "b1/8" || string(msg.Data) != "payload 8" || msg.Header.Get("Payment-Id") != "pay_8" {
		t.Fatalf("message 8: %v %q", msg.Header, msg.Data)
	}
}

// TestPublishBatchRefusals: the envelopes whose subject no stream, or
// another stream than WithStream's, captures, get errors, and those whose
// subject no publication can go to get permanent refusals; the others of
// the batch are confirmed and stored, and nothing of the refused ones is.
func TestPublishBatchRefusals(t *testing.T) {
	_, js := natstest.Connect(t, natstest.URL(t))
	stream, prefix := newStream(t, js, 0)
	other, otherPrefix := newStream(t, js, 0)
	sink := natsink.New(js, natsink.WithStream(stream), natsink.WithWindow(8), natsink.WithTimeout(5*time.Second))
	es := batchOf("b2", 40, prefix+"ok")
	refused := map[int]func(error) bool{}
	for i := 3; i < len(es); i += 8 {
		es[i].Topic = "nowhere." + prefix + "x"
		refused[i] = func(err error) bool { return errors.Is(err, jetstream.ErrNoStreamResponse) }
	}
	es[5].Topic = otherPrefix + "x"
	refused[5] = func(err error) bool {
		var api *jetstream.APIError
		return errors.As(err, &api)
	}
	for _, i := range []int{6, 10} {
		refused[i] = func(err error) bool { return errors.Is(err, nats.ErrBadSubject) && errors.Is(err, outbox.ErrPermanent) }
	}
	es[6].Topic = prefix + "with space"
	es[10].Topic = prefix + "*"
	es[9].Topic = ""
	refused[9] = func(err error) bool {
		return errors.Is(err, natsink.ErrNoSubject) && errors.Is(err, outbox.ErrPermanent)
	}

	errs := sink.PublishBatch(context.Background(), es)
	for i, err := range errs {
		if is, ok := refused[i]; ok {
			if !is(err) || !strings.Contains(err.Error(), es[i].ID) {
				t.Errorf("%s to %q: %v", es[i].ID, es[i].Topic, err)
			}
		} else if err != nil {
			t.Errorf("%s: %v", es[i].ID, err)
		}
	}
	ids := storedIDs(t, js, stream)
	if len(ids) != len(es)-len(refused) {
		t.Errorf("the stream holds %d messages, want the %d confirmed", len(ids), len(es)-len(refused))
	}
	for i, e := range es {
		if _, no := refused[i]; ids[e.ID] != 1 && !no {
			t.Errorf("%s stored %d times", e.ID, ids[e.ID])
		}
	}
	if n := messages(t, js, other); n != 0 {
		t.Errorf("the other stream holds %d messages", n)
	}
}

// TestPublishBatchServerStopped: the server stops while a batch is under
// way. Every envelope gets nil or an error, and none is lost: once the
// server is back, the envelopes with errors published again are stored,
// or recognized as stored already by their IDs, and so is the whole batch
// published once more; the stream holds each message once.
func TestPublishBatchServerStopped(t *testing.T) {
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv.URL, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	stream, prefix := newStream(t, js, 0)
	const window = 32
	sink := natsink.New(js, natsink.WithWindow(window), natsink.WithTimeout(5*time.Second))
	es := batchOf("b3", 3000, prefix+"a")
	// The batch waits on the stalled publication at 1,000, its window
	// full, until the server stops. The last publication the window
	// holds was sent only once the oldest before the stalled one had its
	// ack: when that publication reaches the server, every envelope
	// before the stalled one has its outcome.
	const stalled = 999
	es[stalled].Topic = "stall." + prefix + "a"
	stall(t, srv.URL, es[stalled].Topic)
	full := reached(t, srv.URL, prefix+"a", es[stalled+window-1].ID)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case <-full:
			srv.Stop()
		case <-time.After(30 * time.Second):
		}
	}()
	errs := sink.PublishBatch(context.Background(), es)
	<-stopped
	var failed []outbox.Envelope
	for i, err := range errs {
		switch {
		case i < stalled && err != nil:
			t.Fatalf("%s, published before the stop: %v", es[i].ID, err)
		case i == stalled:
			if err == nil {
				t.Fatalf("%s was acknowledged by no stream", es[i].ID)
			}
		case err != nil:
			failed = append(failed, es[i])
		}
	}
	if len(failed) == 0 {
		t.Fatal("no publication failed with the server stopped")
	}
	t.Logf("%d of %d envelopes failed with the server stopped", len(failed), len(es))

	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(15 * time.Second); len(failed) > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d envelopes still failing 15s after the restart, as %s: %v", len(failed), failed[0].ID, sink.PublishBatch(context.Background(), failed[:1])[0])
		}
		var again []outbox.Envelope
		for i, err := range sink.PublishBatch(context.Background(), failed) {
			if err != nil {
				again = append(again, failed[i])
			}
		}
		failed = again
	}
	// A relay that lost its marks publishes the whole batch again.
	again := append(slices.Clone(es[:stalled]), es[stalled+1:]...)
	for i, err := range sink.PublishBatch(context.Background(), again) {
		if err != nil {
			t.Fatalf("%s published again: %v", again[i].ID, err)
		}
	}
	ids := storedIDs(t, js, stream)
	if len(ids) != len(es)-1 {
		t.Errorf("the stream holds %d IDs, want %d", len(ids), len(es)-1)
	}
	for i, e := range es {
		if i != stalled && ids[e.ID] != 1 {
			t.Errorf("%s stored %d times, want once", e.ID, ids[e.ID])
		}
	}
}

// TestPublishBatchContextEnds: ctx ends while the batch waits for an ack
// that does not come. PublishBatch returns at once, well within its
// timeout: the envelope waited on gets an error with ctx's cause, those
// acknowledged before keep their nil, and the envelopes past the window
// were never sent.
//
// The stalled envelope was sent only once fewer than the window's
// publications were waiting: those a window before it had their acks
// before ctx ended. The acks of the few between may come after.
func TestPublishBatchContextEnds(t *testing.T) {
	url := natstest.URL(t)
	_, js := natstest.Connect(t, url)
	stream, prefix := newStream(t, js, 0)
	const window = 8
	sink := natsink.New(js, natsink.WithWindow(window), natsink.WithTimeout(time.Minute))
	es := batchOf("b4", 600, prefix+"a")
	const stalled = 99
	es[stalled].Topic = "stall." + prefix + "a"
	arrived := stall(t, url, es[stalled].Topic)
	stopping := errors.New("the relay is stopping")
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() {
		<-arrived
		cancel(stopping)
	}()
	start := time.Now()
	errs := sink.PublishBatch(ctx, es)
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("PublishBatch returned after %v, not when ctx ended", took)
	}
	ids := storedIDs(t, js, stream)
	for i, err := range errs {
		switch {
		case i <= stalled-window && err != nil:
			t.Errorf("%s, acknowledged before ctx ended: %v", es[i].ID, err)
		case i < stalled && err != nil && !errors.Is(err, stopping):
			t.Errorf("%s: %v, want nil or ctx's cause", es[i].ID, err)
		case i == stalled && !errors.Is(err, stopping):
			t.Errorf("%s, waited on: %v, want ctx's cause", es[i].ID, err)
		case i >= stalled+window && (!errors.Is(err, stopping) || ids[es[i].ID] != 0):
			t.Errorf("%s, past the window: %v, stored %d times; want ctx's cause, not sent", es[i].ID, err, ids[es[i].ID])
		}
		if err == nil && ids[es[i].ID] != 1 {
			t.Errorf("%s confirmed, stored %d times", es[i].ID, ids[es[i].ID])
		}
	}
	if n := len(ids); n < stalled-window || n > stalled+window-1 {
		t.Errorf("the stream holds %d messages, want %d to %d: those sent before the stalled one and at most the rest of its window", n, stalled-window, stalled+window-1)
	}
}

func TestWithWindowPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	natsink.WithWindow(0)
}
