package redisstore

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// callClient returns the client the Store's calls go through, and whether
// it stops a call at its context's deadline.
//
// go-redis stops a call at its context's deadline only with
// ContextTimeoutEnabled; without it a stalled call waits out the client's
// ReadTimeout (5s by default) and may be retried, so the Store must bound
// it itself. A goroutine per call does (see bounded), at a price every
// first execution pays: 1.28× the record floor's time at one client over
// loopback HTTP with a default client, against 1.12× with
// ContextTimeoutEnabled (BENCHMARKS.md). So for a *redis.Client (single
// node, or Sentinel from redis.NewFailoverClient) the Store calls through
// a clone made by its WithTimeout with its own read and write timeouts: a
// clone that shares the client's connection pools, with
// ContextTimeoutEnabled set on the clone's own copy of the options, and
// measured within 5% of a client with the option (BENCHMARKS.md, 1 and 64
// clients). The client the caller gave stays as it was. go-redis v9 makes
// the clone without the hooks added to the client (tracing, metrics), so
// the Store's commands do not pass through them; redisstore's README says
// so, and that a client with ContextTimeoutEnabled keeps them. Cluster and Ring clients have no such clone: unless they have
// ContextTimeoutEnabled, their calls with a deadline are bounded by a
// goroutine each. A client whose timeouts are disabled (-2, which
// disables the socket deadlines a context's deadline would go through)
// is bounded that way too.
func callClient(client redis.UniversalClient) (redis.UniversalClient, bool) {
	switch c := client.(type) {
	case *redis.Client:
		opt := c.Options()
		if opt.ReadTimeout < 0 || opt.WriteTimeout < 0 {
			return c, false
		}
		if opt.ContextTimeoutEnabled {
			return c, true
		}
		clone := c.WithTimeout(opt.ReadTimeout)
		clone.Options().WriteTimeout = opt.WriteTimeout
		clone.Options().ContextTimeoutEnabled = true
		return clone, true
	case *redis.ClusterClient:
		opt := c.Options()
		return c, opt.ContextTimeoutEnabled && opt.ReadTimeout >= 0 && opt.WriteTimeout >= 0
	case *redis.Ring:
		opt := c.Options()
		return c, opt.ContextTimeoutEnabled && opt.ReadTimeout >= 0 && opt.WriteTimeout >= 0
	}
	return client, false
}

// bounded runs call and returns by ctx's deadline: directly when the
// Store's client honours deadlines (see callClient) or ctx has none;
// otherwise call runs in a goroutine of its own, and when the deadline
// comes first bounded returns ctx's error while call ends in the
// background. Like any call that timed out, its
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
