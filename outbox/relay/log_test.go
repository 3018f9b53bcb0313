package relay_test

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
	"github.com/go-idempotency/idempotency/outbox/relay"
)

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

// TestLoggerReportsFailures: with WithLogger, a failed publish is logged
// at Warn with the message's ID and the sink's error, a message gone dead
// at Error with its last error, a published one at Debug; each record
// names the relay, and the observer still gets every event.
func TestLoggerReportsFailures(t *testing.T) {
	db := outboxtest.NewDB(t)
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
	flaky := db.Enqueue(t, "flaky", outbox.Message{Topic: "payment.created"})[0]
	poison := db.Enqueue(t, "poison", outbox.Message{Topic: "poison"})[0]
	logs := &logRecorder{}
	ev := start(t, db.Pool, rec, relay.WithName("r-log"), relay.WithMaxAttempts(2), relay.WithLogger(slog.New(logs)))
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

// TestLoggerReportsStatementErrors: a statement that fails (here: the
// outbox table is missing) is logged at Error with the database's error,
// where before only an observer saw it.
func TestLoggerReportsStatementErrors(t *testing.T) {
	db := outboxtest.NewDB(t)
	logs := &logRecorder{}
	failed := make(chan struct{}, 1)
	r := relay.New(db.Pool, outboxtest.NewRecorder(), relay.WithTable("no_such_outbox"), relay.WithLogger(slog.New(logs)),
		relay.WithObserver(func(_ context.Context, e relay.Event) {
			if e.Kind == relay.EventError {
				select {
				case failed <- struct{}{}:
				default:
				}
			}
		}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	select {
	case <-failed:
	case <-time.After(10 * time.Second):
		t.Error("no EventError within 10s")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
	errs := logs.find(slog.LevelError, "")
	if len(errs) == 0 || !strings.Contains(errs[0]["error"], "no_such_outbox") || errs[0]["relay"] != r.Name() {
		t.Fatalf("Error records %v, want the missing table's error", errs)
	}
}

// TestLoggerReportsLifecycle: a message the sink refuses and a row the
// relay cannot read are logged at Error with their errors, a message the
// sink suspends at Warn with the reason, a claim found lost at Warn.
func TestLoggerReportsLifecycle(t *testing.T) {
	db := outboxtest.NewDB(t)
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
	refused := db.Enqueue(t, "r", outbox.Message{Topic: "refused"})[0]
	suspended := db.Enqueue(t, "s", outbox.Message{Topic: "metered"})[0]
	unreadable := db.Enqueue(t, "u", outbox.Message{Topic: "fine"})[0]
	key, seq, _ := outbox.ParseID(unreadable)
	if _, err := db.Pool.Exec(ctx, `UPDATE idempotency_outbox SET enqueued_at = 'infinity' WHERE storage_key = $1 AND seq = $2`, key, seq); err != nil {
		t.Fatal(err)
	}
	logs := &logRecorder{}
	ev := start(t, db.Pool, rec, relay.WithName("r-log"), relay.WithLogger(slog.New(logs)))
	ev.Await(t, 10*time.Second, "refused, suspended, unreadable", func() bool {
		return len(ev.Of(relay.EventRefused)) == 1 && len(ev.Of(relay.EventSuspended)) == 1 && len(ev.Of(relay.EventUnreadable)) == 1
	})
	if r := logs.find(slog.LevelError, refused); len(r) != 1 || r[0]["error"] != "invalid subject" || !strings.Contains(r[0]["msg"], "refused") {
		t.Errorf("the refusal logged as %v", r)
	}
	if r := logs.find(slog.LevelError, unreadable); len(r) != 1 || !strings.Contains(r[0]["error"], "column enqueued_at: cannot scan Infinity") || r[0]["relay"] != "r-log" {
		t.Errorf("the unreadable row logged as %v", r)
	}
	if r := logs.find(slog.LevelWarn, suspended); len(r) != 1 || r[0]["reason"] != "budget exhausted" {
		t.Errorf("the suspension logged as %v", r)
	}
}
