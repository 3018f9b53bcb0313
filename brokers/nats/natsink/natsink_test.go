package natsink_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/go-idempotency/idempotency"
	idemnats "github.com/go-idempotency/idempotency/brokers/nats"
	"github.com/go-idempotency/idempotency/brokers/nats/natsink"
	"github.com/go-idempotency/idempotency/brokers/nats/natstest"
	"github.com/go-idempotency/idempotency/memstore"
	"github.com/go-idempotency/idempotency/outbox"
)

// newStream creates a stream of its own on js, capturing the subjects
// under a random prefix, with the Duplicates window given (0: JetStream's
// default), deleted when t ends. It returns the stream's name and the
// subject prefix ("p.").
func newStream(t testing.TB, js jetstream.JetStream, duplicates time.Duration) (name, prefix string) {
	t.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	id := hex.EncodeToString(b[:])
	name, prefix = "SINKTEST_"+strings.ToUpper(id), "sinktest."+id+"."
	_, err := js.CreateStream(context.Background(), jetstream.StreamConfig{
		Name: name, Subjects: []string{prefix + ">"}, Duplicates: duplicates,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	return name, prefix
}

// messages returns the number of messages stream holds.
func messages(t testing.TB, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	st, err := js.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	return st.CachedInfo().State.Msgs
}

func envelope(id, topic, payload string) outbox.Envelope {
	return outbox.Envelope{ID: id, Topic: topic, Payload: []byte(payload), Attempt: 1, EnqueuedAt: time.Now()}
}

// TestPublish: the message reaches the stream on its topic's subject,
// with its payload, its headers and its ID as Nats-Msg-Id.
func TestPublish(t *testing.T) {
	_, js := natstest.Connect(t, natstest.URL(t))
	stream, prefix := newStream(t, js, 0)
	sink := natsink.New(js, natsink.WithStream(stream))
	e := envelope("k1/1", prefix+"payment.created", `{"amount":1999}`)
	e.Headers = map[string]string{"Content-Type": "application/json", "Payment-Id": "pay_7"}
	if err := sink.Publish(context.Background(), e); err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := st.GetMsg(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if msg.Subject != e.Topic || string(msg.Data) != string(e.Payload) {
		t.Fatalf("stored %s %q, want %s %q", msg.Subject, msg.Data, e.Topic, e.Payload)
	}
	for k, want := range map[string]string{jetstream.MsgIDHeader: "k1/1", "Content-Type": "application/json", "Payment-Id": "pay_7"} {
		if got := msg.Header.Get(k); got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}
}

// TestPublishAgainWithinWindow: a message published again with the same
// ID, as the relay does when it cannot know whether the stream stored it,
// is acknowledged as a duplicate and stored once.
func TestPublishAgainWithinWindow(t *testing.T) {
	_, js := natstest.Connect(t, natstest.URL(t))
	stream, prefix := newStream(t, js, 0)
	sink := natsink.New(js)
	e := envelope("k2/1", prefix+"payment.created", "p")
	for i, wantDuplicate := range []bool{false, true, true} {
		ack, err := sink.PublishAck(context.Background(), e)
		if err != nil {
			t.Fatal(err)
		}
		if ack.Duplicate != wantDuplicate || ack.Sequence != 1 {
			t.Fatalf("publication %d: %+v, want duplicate %v at sequence 1", i+1, ack, wantDuplicate)
		}
	}
	if n := messages(t, js, stream); n != 1 {
		t.Fatalf("the stream holds %d messages, want 1", n)
	}
}

// TestPastTheWindow shows what the Duplicates window bounds: a message
// published again after the window is stored a second time, under the
// same Nats-Msg-Id, and a consumer that deduplicates on it (idemnats's
// default key) still runs once.
func TestPastTheWindow(t *testing.T) {
	const window = 500 * time.Millisecond
	_, js := natstest.Connect(t, natstest.URL(t))
	stream, prefix := newStream(t, js, window)
	sink := natsink.New(js)
	e := envelope("k3/1", prefix+"payment.created", "p")
	if err := sink.Publish(context.Background(), e); err != nil {
		t.Fatal(err)
	}
	// Waiting for the window to pass is the point of the test: nothing
	// signals it.
	time.Sleep(window + 250*time.Millisecond)
	ack, err := sink.PublishAck(context.Background(), e)
	if err != nil {
		t.Fatal(err)
	}
	if ack.Duplicate || ack.Sequence != 2 {
		t.Fatalf("past the window: %+v, want a second message at sequence 2", ack)
	}
	if n := messages(t, js, stream); n != 2 {
		t.Fatalf("the stream holds %d messages, want 2", n)
	}

	cons, err := js.CreateOrUpdateConsumer(context.Background(), stream, jetstream.ConsumerConfig{
		Durable: "applier", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	store := memstore.New()
	defer store.Close()
	var mu sync.Mutex
	runs := 0
	p := idemnats.NewProcessor(idempotency.NewRunner(store), "payments.apply", func(ctx context.Context, msg jetstream.Msg) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		runs++
		return runs, nil
	})
	var outcomes []idemnats.Outcome
	for range 2 {
		msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		out, err := p.Process(context.Background(), msg)
		if err != nil {
			t.Fatal(err)
		}
		outcomes = append(outcomes, out)
	}
	if runs != 1 || !outcomes[0].Ran || !outcomes[1].Replayed {
		t.Fatalf("the consumer ran %d times (%+v), want once, then a replay", runs, outcomes)
	}
}

// TestExpectedStream: with WithStream, a subject that the stream named
// does not capture is refused, and stored nowhere.
func TestExpectedStream(t *testing.T) {
	_, js := natstest.Connect(t, natstest.URL(t))
	stream, prefix := newStream(t, js, 0)
	other, otherPrefix := newStream(t, js, 0)
	sink := natsink.New(js, natsink.WithStream(stream), natsink.WithTimeout(2*time.Second))
	if err := sink.Publish(context.Background(), envelope("k4/1", otherPrefix+"x", "p")); err == nil {
		t.Fatal("a subject of another stream was published")
	}
	if err := sink.Publish(context.Background(), envelope("k4/2", "nowhere."+prefix+"x", "p")); err == nil {
		t.Fatal("a subject of no stream was published")
	}
	if a, b := messages(t, js, stream), messages(t, js, other); a != 0 || b != 0 {
		t.Fatalf("the streams hold %d and %d messages, want none", a, b)
	}
}

// TestBrokerRestart: while the server is down, Publish fails within its
// timeout; after the server came back, the same message published again
// is a duplicate of the copy stored before: the server keeps the IDs of
// its window across a restart.
func TestBrokerRestart(t *testing.T) {
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv.URL, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	_, prefix := newStream(t, js, 0)
	sink := natsink.New(js, natsink.WithTimeout(time.Second))
	stored := envelope("k5/1", prefix+"a", "p")
	if err := sink.Publish(context.Background(), stored); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	start := time.Now()
	if err := sink.Publish(context.Background(), envelope("k5/2", prefix+"a", "p")); err == nil {
		t.Fatal("published with the server down")
	} else if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Publish failed after %v, past its 1s timeout: %v", d, err)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	var ack *jetstream.PubAck
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		if ack, err = sink.PublishAck(context.Background(), stored); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if !ack.Duplicate || ack.Sequence != 1 {
		t.Fatalf("after the restart: %+v, want a duplicate of sequence 1", ack)
	}
}

// TestCheckDuplicates compares the stream's window with what the relay
// needs.
func TestCheckDuplicates(t *testing.T) {
	_, js := natstest.Connect(t, natstest.URL(t))
	stream, _ := newStream(t, js, 30*time.Second)
	if err := natsink.CheckDuplicates(context.Background(), js, stream, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	err := natsink.CheckDuplicates(context.Background(), js, stream, 45*time.Second)
	if !errors.Is(err, natsink.ErrWindowTooShort) || !strings.Contains(err.Error(), "30s") {
		t.Fatalf("a 30s window against 45s: %v", err)
	}
	if err := natsink.CheckDuplicates(context.Background(), js, "NO_SUCH_STREAM", time.Second); err == nil || errors.Is(err, natsink.ErrWindowTooShort) {
		t.Fatalf("no such stream: %v", err)
	}
}

func TestNoSubject(t *testing.T) {
	sink := natsink.New(nopJetStream{})
	if err := sink.Publish(context.Background(), envelope("k/1", "", "p")); !errors.Is(err, natsink.ErrNoSubject) {
		t.Fatalf("empty topic: %v", err)
	}
}

func TestMisconfigurationPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"New(nil)":       func() { natsink.New(nil) },
		"WithSubject":    func() { natsink.WithSubject(nil) },
		"WithStream":     func() { natsink.WithStream("") },
		"WithTimeout(0)": func() { natsink.WithTimeout(0) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			f()
		})
	}
}

// nopJetStream is a JetStream that is never called.
type nopJetStream struct{ jetstream.JetStream }
