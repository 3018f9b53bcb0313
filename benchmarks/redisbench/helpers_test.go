package redisbench

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/benchmarks/load"
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
	s := redisstore.New(client, opts...)
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

// storeReq is an AcquireRequest with a fingerprint and token of the
// middleware's sizes.
func storeReq(key, token string) idempotency.AcquireRequest {
	return idempotency.AcquireRequest{Key: key, Token: token, Fingerprint: strings.Repeat("f", 64),
		Lease: 10 * time.Second, TTL: 5 * time.Minute}
}

// storeResponse is what load.Handler writes, as the store keeps it.
func storeResponse(payload []byte) *idempotency.Response {
	return &idempotency.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: payload}
}

// runPhase runs f(g, r) for r < perGoroutine in each of goroutines
// goroutines g, and returns how long the phase took.
func runPhase(goroutines, perGoroutine int, f func(g, r int)) time.Duration {
	var wg sync.WaitGroup
	start := time.Now()
	for g := range goroutines {
		wg.Go(func() {
			for r := range perGoroutine {
				f(g, r)
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}

// serverCPU is the server's used_cpu_sys + used_cpu_user.
func serverCPU(b *testing.B, c *redis.Client) time.Duration {
	info, err := load.Info(ctx, c, "cpu")
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, name := range []string{"used_cpu_sys", "used_cpu_user"} {
		v, err := strconv.ParseFloat(info[name], 64)
		if err != nil {
			b.Fatalf("INFO cpu %s: %v", name, err)
		}
		total += v
	}
	return time.Duration(total * float64(time.Second))
}
