package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
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

// countingHook counts the commands a client processes.
type countingHook struct{ n atomic.Int64 }

func (h *countingHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}
func (h *countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestDefaultClientKeptAsGiven: a client without ContextTimeoutEnabled is
// left as it was: the Store calls through a clone of its own that honours
// deadlines, which go-redis's WithTimeout makes without the hooks added to
// the client. A client with ContextTimeoutEnabled is used as it is, its
// hooks seeing the Store's calls.
func TestDefaultClientKeptAsGiven(t *testing.T) {
	for _, honours := range []bool{false, true} {
		c := redis.NewClient(&redis.Options{Addr: redistest.Addr(t), ContextTimeoutEnabled: honours})
		defer c.Close()
		hook := &countingHook{}
		c.AddHook(hook)
		s := newStore(t, c)
		key := randKey()
		mustAcquire(t, s, req(key, "t"), idempotency.Acquired)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if err := s.Complete(ctx, key, "t", sampleResponse(), time.Hour); err != nil {
			t.Fatal(err)
		}
		cancel()
		if c.Options().ContextTimeoutEnabled != honours {
			t.Fatalf("New changed the caller's ContextTimeoutEnabled from %v", honours)
		}
		if n := hook.n.Load(); honours != (n >= 2) {
			t.Fatalf("ContextTimeoutEnabled %v: the caller's hook saw %d of the Store's commands", honours, n)
		}
	}
}
