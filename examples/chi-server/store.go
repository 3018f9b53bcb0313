package main

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/memstore"
	"github.com/go-idempotency/idempotency/redisstore"
)

// openStore returns the in-memory store, or the Redis store when redisAddr
// is set (host:port of a single node). Two servers sharing one Redis replay
// each other's responses.
func openStore(redisAddr string) (idempotency.Store, string, func(), error) {
	if redisAddr == "" {
		s := memstore.New()
		return s, "memstore", func() { _ = s.Close() }, nil
	}
	client := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		_ = client.Close()
		return nil, "", nil, fmt.Errorf("redis at %s: %w", redisAddr, err)
	}
	s := redisstore.New(client, redisstore.WithPrefix("chi-server:"))
	return s, "redis " + redisAddr, func() { _ = s.Close(); _ = client.Close() }, nil
}
