package servercheck_test

import (
	"context"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency/redisstore"
	"github.com/go-idempotency/idempotency/servercheck"
)

// The Redis server's settings, checked once at start-up: what is unsafe is
// logged, and the store starts either way.
func ExampleRedis() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer client.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	report, err := servercheck.Redis(ctx, client)
	if err != nil {
		slog.Warn("could not check the Redis server", "error", err)
	}
	report.Log(ctx, slog.Default())

	store := redisstore.New(client)
	defer store.Close()
}
