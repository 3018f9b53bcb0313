package redisstore_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// head is a record's field h, as the scripts write it:
// <state><token length>:<token><epoch>:<lease end>:<fingerprint>.
type head struct {
	state    byte // 'p' (in progress), 'P' (in progress, watched) or 'c' (complete)
	token    string
	epoch    int64
	leaseEnd int64 // Unix milliseconds on the server's clock
	fp       string
}

// parseHead parses a head as strictly as acquire.lua does.
func parseHead(h string) (head, error) {
	var hd head
	if h == "" || !strings.ContainsRune("pPc", rune(h[0])) {
		return hd, fmt.Errorf("head %q: unknown state", h)
	}
	hd.state = h[0]
	rest := h[1:]
	number := func(what string, max int) (int64, error) {
		n, r, ok := strings.Cut(rest, ":")
		if !ok || n == "" || len(n) > max || strings.Trim(n, "0123456789") != "" || n[0] == '0' {
			return 0, fmt.Errorf("head %q: malformed %s", h, what)
		}
		rest = r
		return strconv.ParseInt(n, 10, 64)
	}
	tl, err := number("token length", 9)
	if err != nil {
		return hd, err
	}
	if int64(len(rest)) < tl {
		return hd, fmt.Errorf("head %q: token cut short", h)
	}
	hd.token, rest = rest[:tl], rest[tl:]
	if hd.epoch, err = number("epoch", 15); err != nil {
		return hd, err
	}
	if hd.leaseEnd, err = number("lease end", 15); err != nil {
		return hd, err
	}
	hd.fp = rest
	return hd, nil
}

// stateOf returns the state a head h records: "in_progress", "complete",
// or "" when there is no head.
func stateOf(h string) string {
	switch {
	case h == "":
		return ""
	case h[0] == 'c':
		return "complete"
	case h[0] == 'p' || h[0] == 'P':
		return "in_progress"
	}
	return "unknown"
}

// recordState returns the state of the record at rkey, "" when there is
// none.
func recordState(c redis.Cmdable, rkey string) string {
	return stateOf(c.HGet(ctx, rkey, "h").Val())
}

// recordStateAt is recordState through a plain connection to addr.
func recordStateAt(addr, rkey string) (string, error) {
	h, err := redistest.Do(addr, "HGET", rkey, "h")
	return stateOf(h), err
}

// isWatched reports whether the record at rkey is marked as watched.
func isWatched(c redis.Cmdable, rkey string) bool {
	h := c.HGet(ctx, rkey, "h").Val()
	return h != "" && h[0] == 'P'
}

// leaseLeft returns the time left on the lease of the in-progress record at
// rkey, as the scripts judge it: the head's lease end less the server's
// TIME.
func leaseLeft(t *testing.T, c redis.Cmdable, rkey string) time.Duration {
	t.Helper()
	hd, err := parseHead(c.HGet(ctx, rkey, "h").Val())
	if err != nil {
		t.Fatal(err)
	}
	return time.Duration(hd.leaseEnd-serverTime(t, c).UnixMilli()) * time.Millisecond
}

// serverTime returns the Redis server's clock (TIME).
func serverTime(t *testing.T, c redis.Cmdable) time.Time {
	t.Helper()
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now
}

// wantLeaseLeft checks that the lease of the record at rkey has about lease
// left.
func wantLeaseLeft(t *testing.T, c redis.Cmdable, rkey string, lease time.Duration) {
	t.Helper()
	if left := leaseLeft(t, c, rkey); left <= lease-5*time.Second || left > lease {
		t.Errorf("lease of %s has %v left, want about %v", rkey, left, lease)
	}
}

// waitLeaseExpired polls until the lease of the record at rkey has run out
// on the server's clock, without touching the record.
func waitLeaseExpired(t *testing.T, c redis.Cmdable, rkey string) {
	t.Helper()
	if !redistest.WaitFor(5*time.Second, func() bool { return leaseLeft(t, c, rkey) <= 0 }) {
		t.Fatal("lease never expired on the server clock")
	}
}

func TestParseHead(t *testing.T) {
	hd, err := parseHead("P2:ab17:1796120945665:\x00fp:")
	if err != nil || hd != (head{'P', "ab", 17, 1796120945665, "\x00fp:"}) {
		t.Fatalf("parseHead = %+v, %v", hd, err)
	}
	for _, h := range []string{"", "x2:ab1:5:f", "p0:1:5:f", "p2:a", "p2:ab01:5:f", "p2:ab1:0:f", "p2:ab1:05:f", "p2:ab1:x:f", "p2:ab1:5"} {
		if _, err := parseHead(h); err == nil {
			t.Errorf("parseHead(%q) succeeded", h)
		}
	}
}
