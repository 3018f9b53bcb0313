package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency/internal/outboxtest"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/outbox/relay"
)

var ctx = context.Background()

func wantPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Errorf("%s did not panic", what)
		}
	}()
	f()
}

// TestOptionsPanic: misconfiguration panics at construction.
func TestOptionsPanic(t *testing.T) {
	wantPanic(t, "WithBatchSize(0)", func() { relay.WithBatchSize(0) })
	wantPanic(t, "WithClaimLease(0)", func() { relay.WithClaimLease(0) })
	wantPanic(t, "WithBackoff(0, 1s)", func() { relay.WithBackoff(0, time.Second) })
	wantPanic(t, "WithBackoff(2s, 1s)", func() { relay.WithBackoff(2*time.Second, time.Second) })
	wantPanic(t, "WithMaxAttempts(0)", func() { relay.WithMaxAttempts(0) })
	wantPanic(t, "WithPollInterval(0)", func() { relay.WithPollInterval(0) })
	wantPanic(t, "WithRetention(-1s)", func() { relay.WithRetention(-time.Second) })
	wantPanic(t, "WithTable(a-b)", func() { relay.WithTable("a-b") })
	wantPanic(t, "WithConcurrency(0)", func() { relay.WithConcurrency(0) })
	wantPanic(t, `WithName("")`, func() { relay.WithName("") })
	wantPanic(t, "WithListenerConfig(nil)", func() { relay.WithListenerConfig(nil) })
	wantPanic(t, "WithObserver(nil)", func() { relay.WithObserver(nil) })
	wantPanic(t, "New(nil pool)", func() { relay.New(nil, outboxtest.NewRecorder()) })

	cfg, err := pgxpool.ParseConfig("postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	wantPanic(t, "New(nil sink)", func() { relay.New(pool, nil) })
	wantPanic(t, "New(nil option)", func() { relay.New(pool, outboxtest.NewRecorder(), nil) })
	if r := relay.New(pool, outboxtest.NewRecorder(), relay.WithName("r1")); r.Name() != "r1" {
		t.Errorf("Name() = %q", r.Name())
	}
	if r := relay.New(pool, outboxtest.NewRecorder()); strings.Count(r.Name(), "/") != 2 {
		t.Errorf("default name %q, want host/pid/random", r.Name())
	}
}

func newPool(t testing.TB, url string, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range configure {
		c(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// table is the default outbox table's edges.
func table(t testing.TB) *lifecycle.Table {
	t.Helper()
	tb, err := outbox.Table("idempotency_outbox")
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

// TestEventKindsNamed: every kind has a name of its own.
func TestEventKindsNamed(t *testing.T) {
	seen := map[string]bool{}
	for _, k := range relay.EventKinds() {
		name := k.String()
		if name == "unknown" || seen[name] {
			t.Errorf("kind %d: name %q", k, name)
		}
		seen[name] = true
	}
	if len(seen) != 16 || relay.EventKind(0).String() != "unknown" || relay.EventKind(200).String() != "unknown" {
		t.Errorf("%d kinds", len(seen))
	}
}
