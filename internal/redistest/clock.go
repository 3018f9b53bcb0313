package redistest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// clockOffsetEnv names the environment variable from which the preloaded
// clock library of a skewed server reads its offset, in nanoseconds.
const clockOffsetEnv = "REDISTEST_CLOCK_OFFSET_NS"

// clockSource is the C source of the library preloaded into a skewed
// redis-server: it adds a fixed offset to the wall clock (clock_gettime of
// CLOCK_REALTIME and CLOCK_REALTIME_COARSE, gettimeofday, time), which is
// what TIME, key expiry and everything else Redis dates read, and leaves the
// monotonic clocks alone. It calls the kernel directly and neither allocates
// nor resolves symbols, so it runs safely inside jemalloc's own start-up,
// which libfaketime does not (it hangs a redis-server linked with jemalloc).
const clockSource = `#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile int ready;
static long long offset_ns;

static long long offset(void) {
	if (!ready) {
		const char *s = getenv("` + clockOffsetEnv + `");
		offset_ns = s ? strtoll(s, NULL, 10) : 0;
		ready = 1;
	}
	return offset_ns;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
	long r = syscall(SYS_clock_gettime, id, ts);
	if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
		long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + offset();
		ts->tv_sec = ns / 1000000000LL;
		ts->tv_nsec = ns % 1000000000LL;
	}
	return (int)r;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
	struct timespec ts;
	(void)tz;
	if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return -1;
	tv->tv_sec = ts.tv_sec;
	tv->tv_usec = ts.tv_nsec / 1000;
	return 0;
}

time_t time(time_t *t) {
	struct timespec ts;
	if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return (time_t)-1;
	if (t) *t = ts.tv_sec;
	return ts.tv_sec;
}
`

// clockLibrary compiles the clock library into a temporary directory of t
// and returns its path.
func clockLibrary(t testing.TB) string {
	t.Helper()
	need(t, "install gcc (and libc6-dev): a skewed clock is a library the test compiles and preloads", "cc")
	dir := t.TempDir()
	src := filepath.Join(dir, "skewclock.c")
	lib := filepath.Join(dir, "skewclock.so")
	if err := os.WriteFile(src, []byte(clockSource), 0o600); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	if out, err := exec.Command("cc", "-shared", "-fPIC", "-O2", "-o", lib, src).CombinedOutput(); err != nil {
		t.Fatalf("redistest: compiling the clock library: %v\n%s", err, out)
	}
	return lib
}

// StartSkewed is Start for a server whose wall clock runs offset ahead of
// the machine's (behind, for a negative offset): its TIME, its key expiry and
// its logs are all offset. The clock is shifted by a small library the test
// compiles with cc and preloads into redis-server; without cc the test is
// skipped (failed under IDEMPOTENCY_REQUIRE_REDIS=1). It returns once the
// server's TIME shows the offset. The server is stopped when t ends; Restart
// starts it again with the same offset.
func StartSkewed(t testing.TB, offset time.Duration, args ...string) *Server {
	t.Helper()
	need(t, "install redis-server/redis-tools", "redis-server")
	env := []string{"LD_PRELOAD=" + clockLibrary(t), clockOffsetEnv + "=" + strconv.FormatInt(int64(offset), 10)}
	dir := t.TempDir()
	s, err := launch(dir, false, env, dataArgs(dir, args)...)
	s = own(t, "a skewed redis-server", s, err)
	skew, err := ClockOffset(s.Addr())
	if err != nil {
		t.Fatalf("redistest: reading the skewed server's TIME: %v", err)
	}
	if d := skew - offset; d < -250*time.Millisecond || d > 250*time.Millisecond {
		t.Fatalf("redistest: the server's clock is %v off the machine's, want %v", skew, offset)
	}
	return s
}

// StartSkewedReplica is StartReplica for a replica whose clock runs offset
// ahead of the machine's (see StartSkewed). It replicates the server at
// masterAddr ("127.0.0.1:<port>": a master, or a proxy in front of one) and
// returns once the replication link is up.
func StartSkewedReplica(t testing.TB, masterAddr string, offset time.Duration, args ...string) *Server {
	t.Helper()
	host, port, err := net.SplitHostPort(masterAddr)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	r := StartSkewed(t, offset, append([]string{"--replicaof", host, port}, args...)...)
	waitLinkUp(t, r)
	return r
}

// ClockOffset returns how far the clock of the Redis server at addr is ahead
// of the machine's (negative when behind), from its TIME, to within the
// round trip.
func ClockOffset(addr string) (time.Duration, error) {
	before := time.Now()
	reply, err := Do(addr, "TIME")
	after := time.Now()
	if err != nil {
		return 0, err
	}
	t, err := ParseTime(reply)
	if err != nil {
		return 0, err
	}
	mid := before.Add(after.Sub(before) / 2)
	return t.Sub(mid), nil
}

// ParseTime parses the reply of TIME as Do flattens it ("seconds\nmicros").
func ParseTime(reply string) (time.Time, error) {
	parts := strings.Fields(reply)
	if len(parts) != 2 {
		return time.Time{}, fmt.Errorf("unexpected TIME reply %q", reply)
	}
	s, err1 := strconv.ParseInt(parts[0], 10, 64)
	us, err2 := strconv.ParseInt(parts[1], 10, 64)
	if err1 != nil || err2 != nil {
		return time.Time{}, fmt.Errorf("unexpected TIME reply %q", reply)
	}
	return time.Unix(s, us*1000), nil
}
