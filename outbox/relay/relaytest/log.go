package relaytest

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/internal/outboxtest"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/outbox/relay"
)

var logTests = []test{
	{"Failures", testLoggerReportsFailures},
	{"Lifecycle", testLoggerReportsLifecycle},
	{"StatementErrors", testLoggerReportsStatementErrors},
}

// logRecorder is a slog.Handler that keeps every record.
type logRecorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r.Clone())
	return nil
}

func (h *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logRecorder) WithGroup(string) slog.Handler      { return h }

// find returns the attributes of the records at level whose attribute id
// is id, each as its value's text.
func (h *logRecorder) find(level slog.Level, id string) []map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var found []map[string]string
	for _, r := range h.records {
		attrs := map[string]string{"msg": r.Message}
		r.Attrs(func(a slog.Attr) bool {
			attrs[a.Key] = a.Value.String()
			return true
		})
		if r.Level == level && attrs["id"] == id {
			found = append(found, attrs)
		}
	}
	return found
}

// testLoggerReportsFailures: with WithLogger, a failed publish is logged
// at Warn with the message's ID and the sink's error, a message gone dead
// at Error with its last error, a published one at Debug; each record
// names the relay, and the observer still gets every event.
func testLoggerReportsFailures(t *testing.T, tg Target) {
	rec := outboxtest.NewRecorder()
	sinkErr := errors.New("nats: no response from stream")
	var mu sync.Mutex
	failed := map[string]bool{}
	rec.FailWith(func(e outbox.Envelope) error {
		mu.Lock()
		defer mu.Unlock()
		if e.Topic == "poison" || !failed[e.ID] {
			failed[e.ID] = true
			return sinkErr
		}
		return nil
	})
	flaky := enqueue(t, tg, "flaky", outbox.Message{Topic: "payment.created"})[0]
	poison := enqueue(t, tg, "poison", outbox.Message{Topic: "poison"})[0]
	logs := &logRecorder{}
	ev := start(t, tg.NewRelay, rec, relay.WithName("r-log"), relay.WithMaxAttempts(2), relay.WithLogger(slog.New(logs)))
	ev.Await(t, 10*time.Second, "the flaky message published, the poison message dead", func() bool {
		return len(ev.Of(relay.EventPublished)) == 1 && len(ev.Of(relay.EventDead)) == 1
	})

	retried := logs.find(slog.LevelWarn, flaky)
	if len(retried) != 1 {
		t.Fatalf("%d Warn records of %s, want 1: %v", len(retried), flaky, logs.records)
	}
	if r := retried[0]; r["error"] != sinkErr.Error() || r["attempt"] != "1" || r["topic"] != "payment.created" ||
		r["relay"] != "r-log" || r["backoff"] == "" || !strings.Contains(r["msg"], "publish failed") {
		t.Errorf("the failed publish logged as %v", r)
	}
	if p := logs.find(slog.LevelDebug, flaky); len(p) != 1 || p[0]["attempt"] != "2" {
		t.Errorf("the publish logged as %v, want one Debug record at attempt 2", p)
	}
	dead := logs.find(slog.LevelError, poison)
	if len(dead) != 1 || dead[0]["error"] != sinkErr.Error() || dead[0]["attempt"] != "2" || !strings.Contains(dead[0]["msg"], "dead") {
		t.Errorf("the dead message logged as %v", dead)
	}
	if w := logs.find(slog.LevelWarn, poison); len(w) != 1 {
		t.Errorf("the poison message's first failure logged %d times at Warn, want 1", len(w))
	}
	if n := len(ev.Of(relay.EventRetried)); n != 2 {
		t.Errorf("the observer got %d retried events beside the logger, want 2", n)
	}
}

// testLoggerReportsLifecycle: a message the sink refuses and a row the
// relay cannot read are logged at Error with their errors, a message the
// sink suspends at Warn with the reason.
func testLoggerReportsLifecycle(t *testing.T, tg Target) {
	rec := outboxtest.NewRecorder()
	rec.FailWith(func(e outbox.Envelope) error {
		switch e.Topic {
		case "refused":
			return outbox.Permanent(errors.New("invalid subject"))
		case "metered":
			return outbox.Suspend("budget exhausted")
		}
		return nil
	})
	refused := enqueue(t, tg, "r", outbox.Message{Topic: "refused"})[0]
	suspended := enqueue(t, tg, "s", outbox.Message{Topic: "metered"})[0]
	unreadable := enqueue(t, tg, "u", outbox.Message{Topic: "fine"})[0]
	corrupt(t, tg, unreadable)
	logs := &logRecorder{}
	ev := start(t, tg.NewRelay, rec, relay.WithName("r-log"), relay.WithLogger(slog.New(logs)))
	ev.Await(t, 10*time.Second, "refused, suspended, unreadable", func() bool {
		return len(ev.Of(relay.EventRefused)) == 1 && len(ev.Of(relay.EventSuspended)) == 1 && len(ev.Of(relay.EventUnreadable)) == 1
	})
	if r := logs.find(slog.LevelError, refused); len(r) != 1 || r[0]["error"] != "invalid subject" || !strings.Contains(r[0]["msg"], "refused") {
		t.Errorf("the refusal logged as %v", r)
	}
	if r := logs.find(slog.LevelError, unreadable); len(r) != 1 || !strings.Contains(r[0]["error"], unreadableWhy) || r[0]["relay"] != "r-log" {
		t.Errorf("the unreadable row logged as %v", r)
	}
	if r := logs.find(slog.LevelWarn, suspended); len(r) != 1 || r[0]["reason"] != "budget exhausted" {
		t.Errorf("the suspension logged as %v", r)
	}
}

// testLoggerReportsStatementErrors: a statement that fails (here: the
// relay's outbox table is missing) is logged at Error with the database's
// error, and the relay carries on.
func testLoggerReportsStatementErrors(t *testing.T, tg Target) {
	missing, err := lifecycle.New("no_such_outbox", tg.Table.Dialect())
	if err != nil {
		t.Fatal(err)
	}
	logs := &logRecorder{}
	ev := newEvents()
	r := relay.NewDB(tg.DB, missing, nil, outboxtest.NewRecorder(), relay.WithLogger(slog.New(logs)), relay.WithObserver(ev.Observe),
		relay.WithPollInterval(50*time.Millisecond))
	runUntilEnd(t, r)
	ev.Await(t, 10*time.Second, "two errors", func() bool { return len(ev.Of(relay.EventError)) >= 2 })
	errs := logs.find(slog.LevelError, "")
	if len(errs) < 2 || !strings.Contains(errs[0]["error"], "no_such_outbox") || errs[0]["relay"] != r.Name() {
		t.Fatalf("Error records %v, want the missing table's error, again after a pause", errs)
	}
}
