package redisstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/redisstore"
	"github.com/redis/go-redis/v9"
)

// newClient returns a client for a Redis server owned by t (or REDIS_ADDR).
func newClient(t testing.TB) *redis.Client {
	t.Helper()
	return clientFor(t, redistest.Addr(t))
}

func clientFor(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	return c
}

// hookedClient returns a client to addr on which a Store runs its calls
// through the client itself, so that the hooks added to it (command
// counters, injected faults) see them: one with ContextTimeoutEnabled. A
// default client's calls go through a clone without its hooks (see
// TestDefaultClientKeptAsGiven).
func hookedClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	return c
}

// newStore returns a Store over client with a prefix unique to the call,
// closed when t ends.
func newStore(t testing.TB, client redis.UniversalClient, opts ...redisstore.Option) *redisstore.Store {
	t.Helper()
	prefix := redistest.Prefix()
	opts = append([]redisstore.Option{redisstore.WithPrefix(prefix)}, opts...)
	s := redisstore.New(client, opts...)
	t.Cleanup(func() { s.Close() })
	if c, ok := client.(*redis.Client); ok && !privateServer() {
		// A shared server: remove this store's records, and only those.
		t.Cleanup(func() { cleanPrefix(c, prefix) })
	}
	return s
}

// cleanPrefix deletes the keys under prefix.
func cleanPrefix(c *redis.Client, prefix string) {
	iter := c.Scan(context.Background(), 0, prefix+"*", 1000).Iterator()
	for iter.Next(context.Background()) {
		c.Unlink(context.Background(), iter.Val())
	}
}

// randKey returns a storage key shaped like the middleware's (hex SHA-256
// length).
func randKey() string {
	var b [32]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func req(key, token string) idempotency.AcquireRequest {
	return idempotency.AcquireRequest{
		Key: key, Token: token, Fingerprint: "fp-" + key[:8],
		Lease: 10 * time.Second, TTL: time.Hour,
	}
}

func mustAcquire(t testing.TB, s idempotency.Store, r idempotency.AcquireRequest, want idempotency.AcquireOutcome) idempotency.Acquisition {
	t.Helper()
	a, err := s.Acquire(context.Background(), r)
	if err != nil {
		t.Fatalf("Acquire(%s): %v", r.Token, err)
	}
	if a.Outcome != want {
		t.Fatalf("Acquire(%s) = %v (epoch %d), want %v", r.Token, a.Outcome, a.Epoch, want)
	}
	return a
}

// commandCounter is a go-redis hook counting the commands sent and the
// round trips used (a pipeline is one round trip).
type commandCounter struct {
	commands, roundTrips atomic.Int64

	mu    sync.Mutex
	names []string // names of the commands sent since reset
}

func (c *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.commands.Add(1)
		c.roundTrips.Add(1)
		c.mu.Lock()
		c.names = append(c.names, cmd.Name())
		c.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (c *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.commands.Add(int64(len(cmds)))
		c.roundTrips.Add(1)
		return next(ctx, cmds)
	}
}

func (c *commandCounter) reset() {
	c.commands.Store(0)
	c.roundTrips.Store(0)
	c.mu.Lock()
	c.names = nil
	c.mu.Unlock()
}

func (c *commandCounter) sent() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.names...)
}

// privateServer reports whether tests start their own servers (REDIS_ADDR
// unset), so they may reconfigure or restart them.
func privateServer() bool { return os.Getenv(redistest.AddrEnv) == "" }
