package load

import (
	"context"
	"os"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency/internal/redistest"
)

// RedisServer is a private redis-server process on a loopback port, with
// its files in a temporary directory.
type RedisServer struct {
	Addr string
	srv  *redistest.Server
	pid  int
}

// StartRedis starts redis-server (found on PATH) on a free loopback port,
// without persistence, and returns once it answers PING. Stop it with Stop.
func StartRedis() (*RedisServer, error) {
	dir, err := os.MkdirTemp("", "idemload-redis-")
	if err != nil {
		return nil, err
	}
	srv, err := redistest.Launch(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &RedisServer{Addr: srv.Addr(), srv: srv, pid: srv.PID()}, nil
}

// Stop stops the server by its PID (SIGTERM, then SIGKILL after 5s), waits
// for it to exit and removes its directory.
func (s *RedisServer) Stop() {
	s.srv.Stop()
	os.RemoveAll(s.srv.Dir())
}

// RedisVersion returns the server's redis_version from INFO, or "" when it
// cannot be read.
func RedisVersion(ctx context.Context, c redis.UniversalClient) string {
	info, err := Info(ctx, c, "server")
	if err != nil {
		return ""
	}
	return info["redis_version"]
}

// Info returns the name: value lines of one INFO section.
func Info(ctx context.Context, c redis.UniversalClient, section string) (map[string]string, error) {
	text, err := c.Info(ctx, section).Result()
	if err != nil {
		return nil, err
	}
	fields := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		if name, value, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && !strings.HasPrefix(name, "#") {
			fields[name] = value
		}
	}
	return fields, nil
}

// PID returns the server's process ID (kept after Stop).
func (s *RedisServer) PID() int { return s.pid }

// Dir returns the server's temporary directory, removed by Stop.
func (s *RedisServer) Dir() string { return s.srv.Dir() }
