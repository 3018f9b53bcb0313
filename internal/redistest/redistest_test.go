package redistest

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// fakeTB records Skip and Fatal instead of ending the real test.
type fakeTB struct {
	testing.TB
	skipped, failed string
}

func (f *fakeTB) Helper()                           {}
func (f *fakeTB) Skip(args ...any)                  { f.skipped = fmt.Sprint(args...); runtime.Goexit() }
func (f *fakeTB) Fatal(args ...any)                 { f.failed = fmt.Sprint(args...); runtime.Goexit() }
func (f *fakeTB) Fatalf(format string, args ...any) { f.Fatal(fmt.Sprintf(format, args...)) }

func runFake(t *testing.T, f func(tb testing.TB)) *fakeTB {
	fake := &fakeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(fake)
	}()
	<-done
	return fake
}

func TestMissingServerSkipsOrFails(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv(AddrEnv, "")

	t.Setenv(RequireEnv, "")
	fake := runFake(t, func(tb testing.TB) { Addr(tb) })
	if !strings.Contains(fake.skipped, "redis-server not found: install redis-server/redis-tools or set REDIS_ADDR") || fake.failed != "" {
		t.Fatalf("without redis-server: skipped %q, failed %q", fake.skipped, fake.failed)
	}

	t.Setenv(RequireEnv, "1")
	fake = runFake(t, func(tb testing.TB) { Addr(tb) })
	if !strings.Contains(fake.failed, "redis-server not found") || fake.skipped != "" {
		t.Fatalf("with %s=1: skipped %q, failed %q", RequireEnv, fake.skipped, fake.failed)
	}

	fake = runFake(t, func(tb testing.TB) { StartCluster(tb, 3) })
	if !strings.Contains(fake.failed, "not found") {
		t.Fatalf("cluster with %s=1: failed %q", RequireEnv, fake.failed)
	}
}

func TestAddrFromEnv(t *testing.T) {
	t.Setenv(AddrEnv, "127.0.0.1:1")
	if got := Addr(t); got != "127.0.0.1:1" {
		t.Fatalf("Addr = %q, want REDIS_ADDR", got)
	}
}

func TestStartStopRestart(t *testing.T) {
	s := Start(t)
	if reply, err := Do(s.Addr(), "SET", "k", "v"); err != nil || reply != "OK" {
		t.Fatalf("SET: %q %v", reply, err)
	}
	if reply, _ := Do(s.Addr(), "CONFIG", "GET", "save"); reply != "save\n" {
		t.Fatalf("save config %q, want empty", reply)
	}
	s.Restart()
	if reply, err := Do(s.Addr(), "EXISTS", "k"); err != nil || reply != "0" {
		t.Fatalf("after restart EXISTS = %q %v, want 0 (fresh server)", reply, err)
	}
	s.Stop()
	if _, err := Do(s.Addr(), "PING"); err == nil {
		t.Fatal("server still answers after Stop")
	}
	s.Stop() // no-op
}

func TestDoFlattensReplies(t *testing.T) {
	addr := Start(t).Addr()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"RPUSH", "l", "a", "b"}, "2"},
		{[]string{"LRANGE", "l", "0", "-1"}, "a\nb"},
		{[]string{"GET", "missing"}, ""},
		{[]string{"ECHO", "line one\r\nline two"}, "line one\r\nline two"},
	} {
		if got, err := Do(addr, tc.args...); err != nil || got != tc.want {
			t.Errorf("Do(%q) = %q, %v; want %q", tc.args, got, err, tc.want)
		}
	}
	if _, err := Do(addr, "GET", "l"); err == nil || !strings.HasPrefix(err.Error(), "WRONGTYPE") {
		t.Errorf("GET on a list: %v, want the WRONGTYPE error", err)
	}
}

func TestReplica(t *testing.T) {
	m := Start(t)
	r := StartReplica(t, m)
	if _, err := Do(m.Addr(), "SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	if !WaitFor(testTimeout, func() bool { v, err := Do(r.Addr(), "GET", "k"); return err == nil && v == "v" }) {
		t.Fatal("write not replicated")
	}
}

const testTimeout = startTimeout
