//go:build unix

package load_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"github.com/go-idempotency/idempotency/benchmarks/load"
	"github.com/redis/go-redis/v9"
)

func TestStartRedis(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not on PATH")
	}
	s, err := load.StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	if !load.Loopback(s.Addr) {
		t.Fatalf("address %s is not loopback", s.Addr)
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	if v := load.RedisVersion(context.Background(), c); v == "" {
		t.Fatal("no redis_version")
	}
	s.Stop()
	if err := c.Ping(context.Background()).Err(); err == nil {
		t.Fatal("server still answers after Stop")
	}
	if pid := s.PID(); syscall.Kill(pid, 0) == nil {
		t.Fatalf("process %d still exists", pid)
	}
	if _, err := os.Stat(s.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("directory %s not removed: %v", s.Dir(), err)
	}
}
