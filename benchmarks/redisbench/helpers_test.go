package redisbench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/redisstore"
	"github.com/redis/go-redis/v9"
)

var ctx = context.Background()

// newStore returns a Store over client with a prefix unique to the call,
// closed when b ends.
func newStore(b testing.TB, client redis.UniversalClient, opts ...redisstore.Option) *redisstore.Store {
	b.Helper()
	prefix := redistest.Prefix()
	opts = append([]redisstore.Option{redisstore.WithPrefix(prefix)}, opts...)
	s := redisstore.New(client, append([]redisstore.Option{redisstore.WithoutStartupCheck()}, opts...)...)
	b.Cleanup(func() { s.Close() })
	if c, ok := client.(*redis.Client); ok && os.Getenv(redistest.AddrEnv) != "" {
		// A shared server: remove this store's records, and only those.
		b.Cleanup(func() { cleanPrefix(c, prefix) })
	}
	return s
}

// cleanPrefix deletes the keys under prefix.
func cleanPrefix(c *redis.Client, prefix string) {
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		c.Unlink(ctx, iter.Val())
	}
}

// storeSource returns the content of file name in redisstore's source
// directory, as the go command resolves the package (go.mod's replace
// directive points it at this repository).
func storeSource(b testing.TB, name string) string {
	b.Helper()
	out, err := exec.Command("go", "list", "-f", "{{.Dir}}", "github.com/go-idempotency/idempotency/redisstore").Output()
	if err != nil {
		b.Fatalf("go list redisstore: %v", err)
	}
	src, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), name))
	if err != nil {
		b.Fatal(err)
	}
	return string(src)
}
