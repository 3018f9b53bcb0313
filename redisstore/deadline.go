package redisstore

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// honoursDeadlines reports whether client stops a call at its context's
// deadline: go-redis does so only with ContextTimeoutEnabled; without it a
// stalled call waits out the client's ReadTimeout, and may be retried.
func honoursDeadlines(client redis.UniversalClient) bool {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// bounded runs call and returns by ctx's deadline: directly when the client
// honours deadlines or ctx has none; otherwise call runs in a goroutine of
// its own, and when the deadline comes first bounded returns ctx's error
// while call ends in the background. Like any call that timed out, its
// script may then have run or not; the lease token fences it either way.
func (s *Store) bounded(ctx context.Context, call func(context.Context) ([]any, error)) ([]any, error) {
	if _, ok := ctx.Deadline(); !ok || s.deadlines {
		return call(ctx)
	}
	type result struct {
		reply []any
		err   error
	}
	done := make(chan result, 1)
	go func() {
		reply, err := call(ctx)
		done <- result{reply, err}
	}()
	select {
	case r := <-done:
		return r.reply, r.err
	case <-ctx.Done():
		select {
		case r := <-done: // it returned too
			return r.reply, r.err
		default:
			return nil, ctx.Err()
		}
	}
}
