package load

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisServer is a private redis-server process on a loopback port, with
// its files in a temporary directory.
type RedisServer struct {
	Addr   string
	cmd    *exec.Cmd
	dir    string
	exited chan struct{}
}

// StartRedis starts redis-server (found on PATH) on a free loopback port,
// without persistence, and returns once it answers PING. Stop it with Stop.
func StartRedis() (*RedisServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("load: redis-server not found on PATH: %w", err)
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		s, err := startRedis(bin)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func startRedis(bin string) (*RedisServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	dir, err := os.MkdirTemp("", "idemload-redis-")
	if err != nil {
		return nil, err
	}
	log, err := os.Create(filepath.Join(dir, "redis.log"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	defer log.Close()
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir)
	cmd.Stdout, cmd.Stderr, cmd.Dir = log, log, dir
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s := &RedisServer{Addr: "127.0.0.1:" + strconv.Itoa(port), cmd: cmd, dir: dir, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.exited) }()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return s, nil
		}
		select {
		case <-s.exited:
			out, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			os.RemoveAll(dir)
			return nil, fmt.Errorf("load: redis-server on port %d exited: %s", port, strings.TrimSpace(string(out)))
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.Stop()
			return nil, errors.New("load: redis-server did not answer PING within 10s")
		}
	}
}

// Stop stops the server by its PID (SIGTERM, then SIGKILL after 5s), waits
// for it to exit and removes its directory.
func (s *RedisServer) Stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	os.RemoveAll(s.dir)
}

// RedisVersion returns the server's redis_version from INFO, or "" when it
// cannot be read.
func RedisVersion(ctx context.Context, c redis.UniversalClient) string {
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v
		}
	}
	return ""
}

// PID returns the server's process ID.
func (s *RedisServer) PID() int { return s.cmd.Process.Pid }

// Dir returns the server's temporary directory, removed by Stop.
func (s *RedisServer) Dir() string { return s.dir }
