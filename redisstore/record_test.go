package redisstore_test

import (
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/internal/redisrecord"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// head returns the decoded head of the record at rkey, failing t when
// there is none or it does not decode.
func head(t *testing.T, c redis.Cmdable, rkey string) redisrecord.Head {
	t.Helper()
	hd, err := redisrecord.ParseHead(c.HGet(ctx, rkey, redisrecord.HeadField).Val())
	if err != nil {
		t.Fatalf("head of %s: %v", rkey, err)
	}
	return hd
}

// stateOf returns the state a head h records: "in_progress", "complete",
// "" when there is no head, or "unknown" when it does not decode.
func stateOf(h string) string {
	if h == "" {
		return ""
	}
	hd, err := redisrecord.ParseHead(h)
	switch {
	case err != nil:
		return "unknown"
	case hd.InProgress():
		return "in_progress"
	}
	return "complete"
}

// recordState returns the state of the record at rkey, "" when there is
// none.
func recordState(c redis.Cmdable, rkey string) string {
	return stateOf(c.HGet(ctx, rkey, redisrecord.HeadField).Val())
}

// recordStateAt is recordState through a plain connection to addr.
func recordStateAt(addr, rkey string) (string, error) {
	h, err := redistest.Do(addr, "HGET", rkey, redisrecord.HeadField)
	return stateOf(h), err
}

// isWatched reports whether the record at rkey is marked as watched.
func isWatched(c redis.Cmdable, rkey string) bool {
	h := c.HGet(ctx, rkey, redisrecord.HeadField).Val()
	return h != "" && h[0] == redisrecord.Watched
}

// leaseLeft returns the time left on the lease of the in-progress record at
// rkey, as the scripts judge it: the head's lease end less the server's
// TIME.
func leaseLeft(t *testing.T, c redis.Cmdable, rkey string) time.Duration {
	t.Helper()
	return time.Duration(head(t, c, rkey).LeaseEnd-serverTime(t, c).UnixMilli()) * time.Millisecond
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
