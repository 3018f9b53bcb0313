package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/faultproxy"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestCallsReturnByTheirDeadline: with Redis's replies held, Complete,
// Extend and Release return by their context's deadline, whether or not the
// go-redis client honours deadlines itself (ContextTimeoutEnabled); without
// the store's own bound they would wait out go-redis's 5s read timeout. A
// call without a deadline is not cut short.
func TestCallsReturnByTheirDeadline(t *testing.T) {
	addr := redistest.Addr(t)
	for _, honours := range []bool{false, true} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", honours), func(t *testing.T) {
			p, err := faultproxy.New(addr)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			c := redis.NewClient(&redis.Options{Addr: p.Addr(), ContextTimeoutEnabled: honours})
			defer c.Close()
			s := newStore(t, c)
			key := randKey()
			mustAcquire(t, s, req(key, "t"), idempotency.Acquired)

			const bound = 200 * time.Millisecond
			calls := map[string]func(ctx context.Context) error{
				"extend":   func(ctx context.Context) error { return s.Extend(ctx, key, "t", 10*time.Second) },
				"complete": func(ctx context.Context) error { return s.Complete(ctx, key, "t", sampleResponse(), time.Hour) },
				"release":  func(ctx context.Context) error { return s.Release(ctx, randKey(), "t") },
			}
			for name, call := range calls {
				p.StallReplies()
				ctx, cancel := context.WithTimeout(context.Background(), bound)
				start := time.Now()
				err := call(ctx)
				took := time.Since(start)
				cancel()
				p.Restore()
				if !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err) {
					t.Fatalf("%s with replies held: %v, want the deadline's error", name, err)
				}
				if took > bound+time.Second {
					t.Fatalf("%s returned after %v, want by its deadline (%v)", name, took, bound)
				}
			}
			// Without a deadline the held reply is waited for.
			held := p.StallRepliesFor(300 * time.Millisecond)
			if err := s.Extend(context.Background(), key, "t", 10*time.Second); err != nil && !errors.Is(err, idempotency.ErrLeaseLost) {
				t.Fatalf("extend without a deadline: %v", err)
			}
			select {
			case <-held:
			default:
				t.Fatal("an extend without a deadline returned before its reply")
			}
		})
	}
}

// isTimeout reports a network timeout, which go-redis returns when it stops
// a call at the deadline itself.
func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}
