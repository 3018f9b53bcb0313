package main

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/go-idempotency/idempotency/brokers/nats/natsink"
	"github.com/go-idempotency/idempotency/brokers/nats/natstest"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/pgstore"
)

func testSettings(t *testing.T) settings {
	t.Helper()
	db := pgtest.Database(t)
	if err := pgstore.Migrate(context.Background(), pgtest.PoolOn(t, db)); err != nil {
		t.Fatal(err)
	}
	return settings{
		database: db, nats: natstest.URL(t),
		duplicates: 2 * time.Minute, lease: 30 * time.Second, poll: 5 * time.Second, backoff: time.Minute,
		concurrency: 1, batch: 10,
	}
}

// TestRefusesShortWindow: a stream whose Duplicates window is shorter
// than the relay's lease, poll and backoff need stops natsrelay before it
// publishes anything.
func TestRefusesShortWindow(t *testing.T) {
	s := testSettings(t)
	_, js := natstest.Connect(t, s.nats)
	s.stream = "RELAYTEST_SHORT"
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: s.stream, Subjects: []string{"relaytest.short.>"}, Duplicates: 20 * time.Second}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), s.stream) })
	err := run(context.Background(), s, slog.New(slog.DiscardHandler))
	if !errors.Is(err, natsink.ErrWindowTooShort) {
		t.Fatalf("a 20s window against a 35s need: %v", err)
	}
}

// TestCreatesStream: with -subjects, natsrelay creates the missing stream
// with the -duplicates window, and runs until its context ends.
func TestCreatesStream(t *testing.T) {
	s := testSettings(t)
	_, js := natstest.Connect(t, s.nats)
	s.stream, s.subjects = "RELAYTEST_NEW", "relaytest.new.a,relaytest.new.b"
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), s.stream) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx, s, slog.New(slog.DiscardHandler)) }()
	var st jetstream.Stream
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) { // no signal for the creation
		var err error
		if st, err = js.Stream(context.Background(), s.stream); err == nil {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("natsrelay returned: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no stream after 10s")
		}
	}
	cfg := st.CachedInfo().Config
	if cfg.Duplicates != s.duplicates || len(cfg.Subjects) != 2 {
		t.Fatalf("stream created with %+v", cfg)
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}
