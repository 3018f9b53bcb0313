package redisstore_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// copyRecord writes copies of the record at KEYS[1] to ARGV[3]..i for i in
// ARGV[1]..ARGV[2], each expiring in an hour: a bulk load of real records
// without a round trip per record. It touches keys it is not given, so it
// runs on a single node only.
var copyRecord = redis.NewScript(`
local h = redis.call('HGETALL', KEYS[1])
for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do
  local k = ARGV[3] .. i
  redis.call('HSET', k, unpack(h))
  redis.call('PEXPIRE', k, 3600000)
end
return {1}
`)

// BenchmarkKeyCount measures the cost of a request's store operations as
// the number of live records in Redis grows from 10^3 to 10^6: Replay is
// Acquire of a COMPLETE record picked at random among them, FirstExecution
// is Acquire of a new key then Complete (kept for 1ms, so the key space
// keeps its size). Records hold an empty body and a Content-Type header, so
// that 10^6 of them fit in about 200 MB of redis-server memory; the body's
// size does not change how Redis finds a key. With REDIS_ADDR set the 10^6
// step is skipped, to spare a shared server.
func BenchmarkKeyCount(b *testing.B) {
	c := newClient(b)
	s := newStore(b, c)
	resp := &idempotency.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}}
	template := randKey()
	mustAcquire(b, s, req(template, "t"), idempotency.Acquired)
	if err := s.Complete(ctx, template, "t", resp, time.Hour); err != nil {
		b.Fatal(err)
	}
	fp := req(template, "t").Fingerprint
	loaded := 0
	for _, n := range []int{1_000, 10_000, 100_000, 1_000_000} {
		if n > 100_000 && !privateServer() {
			b.Logf("skipping %d keys on a shared server (REDIS_ADDR)", n)
			break
		}
		for loaded < n {
			to := min(n, loaded+20_000)
			if err := copyRecord.Run(ctx, c, []string{s.RecordKey(template)}, loaded, to-1, s.RecordKey("k")).Err(); err != nil {
				b.Fatal(err)
			}
			loaded = to
		}
		b.Run(fmt.Sprintf("Replay/keys=%d", n), func(b *testing.B) {
			r := idempotency.AcquireRequest{Token: "dup", Fingerprint: fp, Lease: time.Hour, TTL: time.Hour}
			x := uint64(0x9e3779b97f4a7c15)
			b.ReportAllocs()
			for b.Loop() {
				x ^= x << 13
				x ^= x >> 7
				x ^= x << 17
				r.Key = "k" + strconv.FormatUint(x%uint64(n), 10)
				a, err := s.Acquire(ctx, r)
				if err != nil || a.Outcome != idempotency.Completed {
					b.Fatalf("Acquire(%s): %+v, %v", r.Key, a, err)
				}
			}
		})
		b.Run(fmt.Sprintf("FirstExecution/keys=%d", n), func(b *testing.B) {
			prefix := redistest.Prefix()
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				key := prefix + strconv.Itoa(i)
				i++
				mustAcquire(b, s, req(key, "t"), idempotency.Acquired)
				if err := s.Complete(ctx, key, "t", resp, time.Millisecond); err != nil {
					b.Fatal(err)
				}
			}
		})
		if size, err := c.DBSize(ctx).Result(); err != nil || size < int64(n) {
			b.Fatalf("DBSIZE = %d, %v; want at least %d", size, err, n)
		}
	}
}
