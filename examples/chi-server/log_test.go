package main

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/memstore"
)

// logRecorder is a slog.Handler that keeps every record's level, message
// and attributes, as text.
type logRecorder struct {
	mu      sync.Mutex
	records []map[string]string
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	rec := map[string]string{"level": r.Level.String(), "msg": r.Message}
	r.Attrs(func(a slog.Attr) bool {
		rec[a.Key] = a.Value.String()
		return true
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, rec)
	return nil
}

func (h *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logRecorder) WithGroup(string) slog.Handler      { return h }

// errors returns the records at level ERROR.
func (h *logRecorder) errors() []map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []map[string]string
	for _, r := range h.records {
		if r["level"] == slog.LevelError.String() {
			out = append(out, r)
		}
	}
	return out
}

// TestServerErrorsAreLogged: a 5xx answer of the API is logged at Error
// with its status, route, user and cause, which the client's body does
// not carry.
func TestServerErrorsAreLogged(t *testing.T) {
	store := memstore.New()
	t.Cleanup(func() { store.Close() })
	logs := &logRecorder{}
	srv := httptest.NewServer(newAPI(&backend{store: store}, slog.New(logs)).routes())
	t.Cleanup(srv.Close)
	c := client{t, srv.URL}

	res, body := c.post("/payments?provider=down", aliceToken, "order-1", `{"amount":10,"currency":"EUR"}`)
	if res.StatusCode != http.StatusBadGateway || strings.Contains(body, "?provider=down") {
		t.Fatalf("provider down: %d %s", res.StatusCode, body)
	}
	errs := logs.errors()
	if len(errs) != 1 {
		t.Fatalf("%d Error records, want 1: %v", len(errs), logs.records)
	}
	if r := errs[0]; r["status"] != "502" || r["path"] != "/payments" || r["method"] != "POST" || r["user"] != "alice" ||
		r["msg"] != "payment provider unavailable" || !strings.Contains(r["error"], "payment provider did not answer") {
		t.Errorf("the 502 logged as %v", r)
	}
}

// TestPostgresServerErrorsAreLogged: in PostgreSQL mode, an INSERT that
// fails answers 500 "payment not recorded", and the log says why: the
// database's error.
func TestPostgresServerErrorsAreLogged(t *testing.T) {
	url := pgtest.Database(t)
	logs := &logRecorder{}
	b, err := openBackend(context.Background(), "", url, slog.New(logs))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.close)
	if _, err := b.db.Exec(context.Background(), `ALTER TABLE payments RENAME TO payments_gone`); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(newAPI(b, slog.New(logs)).routes())
	t.Cleanup(srv.Close)
	c := client{t, srv.URL}

	res, body := c.post("/payments", aliceToken, "order-1", `{"amount":10,"currency":"EUR"}`)
	if res.StatusCode != http.StatusInternalServerError || !strings.Contains(body, "payment not recorded") {
		t.Fatalf("INSERT into a missing table: %d %s", res.StatusCode, body)
	}
	var found bool
	for _, r := range logs.errors() {
		if r["status"] == "500" && r["msg"] == "payment not recorded" && strings.Contains(r["error"], `relation "payments" does not exist`) {
			found = true
		}
	}
	if !found {
		t.Errorf("no Error record with the database's error: %v", logs.records)
	}
}
