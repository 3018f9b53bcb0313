package relay_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/internal/outboxtest"
	"github.com/go-idempotency/idempotency/outbox/relay"
)

// TestWithTable: WithTable points New's statements at the table named:
// here one that does not exist, whose error the relay reports
// (EventError), naming the table, and carries on.
func TestWithTable(t *testing.T) {
	db := outboxtest.NewDB(t)
	failed := make(chan error, 1)
	r := relay.New(db.Pool, outboxtest.NewRecorder(), relay.WithTable("no_such_outbox"),
		relay.WithObserver(func(_ context.Context, e relay.Event) {
			if e.Kind == relay.EventError {
				select {
				case failed <- e.Err:
				default:
				}
			}
		}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	select {
	case err := <-failed:
		if !strings.Contains(err.Error(), `"no_such_outbox"`) {
			t.Errorf("the relay's error %v does not name the table", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("no EventError within 10s")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
}
