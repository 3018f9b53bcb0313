package redisstore_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/redisstore"
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
// the number of live records in Redis grows from 10^3 to 10^6, in lockstep:
// databases 0 to 3 of one private server hold 10^3, 10^4, 10^5 and 10^6
// records, and every op makes the request once in each database, in an
// order that rotates from op to op, so that all sizes see the same
// background load. (Measured one size after another, the sizes' rows moved
// by tens of per cent with the machine's load, more than they differ.)
// Replay is Acquire of a COMPLETE record picked at random; FirstExecution is
// Acquire of a new key then Complete (kept for 1ms, so the key space keeps
// its size). Records hold an empty body and a Content-Type header, so that
// the 1.1 million of them fit in about 250 MB of redis-server memory; the
// body's size does not change how Redis finds a key.
//
// It reports the mean time of a request at each size (ns/req@keys=N) and
// the largest rise over the 10^3 value (rise-%). It needs a server of its
// own, and skips when REDIS_ADDR is set.
func BenchmarkKeyCount(b *testing.B) {
	if !privateServer() {
		b.Skip("BenchmarkKeyCount fills four databases with 1.1 million records: it runs only on a server it starts (REDIS_ADDR is set)")
	}
	addr := redistest.Addr(b)
	sizes := []int{1_000, 10_000, 100_000, 1_000_000}
	resp := &idempotency.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}}
	stores := make([]*redisstore.Store, len(sizes))
	template := randKey() // one in each database, so one fingerprint
	fp := req(template, "t").Fingerprint
	for db, n := range sizes {
		c := redis.NewClient(&redis.Options{Addr: addr, DB: db})
		b.Cleanup(func() { c.Close() })
		s := newStore(b, c)
		mustAcquire(b, s, req(template, "t"), idempotency.Acquired)
		if err := s.Complete(ctx, template, "t", resp, time.Hour); err != nil {
			b.Fatal(err)
		}
		for loaded := 0; loaded < n; loaded += 20_000 {
			to := min(n, loaded+20_000)
			if err := copyRecord.Run(ctx, c, []string{s.RecordKey(template)}, loaded, to-1, s.RecordKey("k")).Err(); err != nil {
				b.Fatal(err)
			}
		}
		if size, err := c.DBSize(ctx).Result(); err != nil || size != int64(n+1) {
			b.Fatalf("DB %d: DBSIZE = %d, %v; want %d", db, size, err, n+1)
		}
		stores[db] = s
	}
	// lockstep runs op(db, i) for every database in each of b.N ops and
	// reports the mean time per request at each size.
	lockstep := func(b *testing.B, op func(db, i int)) {
		total := make([]time.Duration, len(sizes))
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			for j := range sizes {
				db := (i + j) % len(sizes)
				start := time.Now()
				op(db, i)
				total[db] += time.Since(start)
			}
		}
		b.StopTimer()
		rise := 0.0
		for db, n := range sizes {
			b.ReportMetric(float64(total[db])/float64(b.N), fmt.Sprintf("ns/req@keys=%d", n))
			rise = max(rise, float64(total[db]-total[0])/float64(total[0]))
		}
		b.ReportMetric(100*rise, "rise-%")
	}
	b.Run("Replay", func(b *testing.B) {
		r := idempotency.AcquireRequest{Token: "dup", Fingerprint: fp, Lease: time.Hour, TTL: time.Hour}
		x := uint64(0x9e3779b97f4a7c15)
		lockstep(b, func(db, _ int) {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			r.Key = "k" + strconv.FormatUint(x%uint64(sizes[db]), 10)
			a, err := stores[db].Acquire(ctx, r)
			if err != nil || a.Outcome != idempotency.Completed {
				b.Fatalf("DB %d: Acquire(%s): %+v, %v", db, r.Key, a, err)
			}
		})
	})
	b.Run("FirstExecution", func(b *testing.B) {
		prefix := redistest.Prefix()
		lockstep(b, func(db, i int) {
			key := prefix + strconv.Itoa(i)
			mustAcquire(b, stores[db], req(key, "t"), idempotency.Acquired)
			if err := stores[db].Complete(ctx, key, "t", resp, time.Millisecond); err != nil {
				b.Fatal(err)
			}
		})
	})
}
