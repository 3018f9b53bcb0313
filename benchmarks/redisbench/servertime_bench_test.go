package redisbench

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/benchmarks/load"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// serverTimeBatch is how many keys each script runs on before the next
// script's turn.
const serverTimeBatch = 100

// BenchmarkServerTime measures the time redis-server spends inside each
// script of a request, from the change in INFO commandstats (EVALSHA usec
// over calls): the store's acquire of a new key and complete of a 1 KiB
// body (a first execution), its acquire of a COMPLETE record (a replay)
// and of one asked for its expiry (replaycache's miss), beside the record
// floor's scripts for the same steps (load.RecordNewScript,
// load.RecordDoneScript, load.RecordReadScript). An op is one key through
// every script; the scripts take turns in batches of 100 keys, so that all
// meet the same background (the key space grows, and rehashes, while keys
// are added). It reports the server µs per call of each script and, per
// request, the store's time over the floor's (first/floor, replay/floor).
func BenchmarkServerTime(b *testing.B) {
	c := redis.NewClient(&redis.Options{Addr: redistest.Addr(b)})
	b.Cleanup(func() { c.Close() })
	s := newStore(b, c)
	prefix := redistest.Prefix()
	b.Cleanup(func() { cleanPrefix(c, prefix) })
	resp := storeResponse(load.Payload(1 << 10))
	meta := strings.Repeat("m", 40)
	key := func(i int) string { return fmt.Sprintf("%064d", i) }
	floorKey := func(i int) []string { return []string{prefix + key(i)} }
	var failed error
	check := func(err error) {
		if err != nil && failed == nil {
			failed = err
		}
	}
	acquire := func(i int, token string, expiry bool) {
		r := storeReq(key(i), token)
		r.WantExpiresIn = expiry
		_, err := s.Acquire(ctx, r)
		check(err)
	}
	scripts := []struct {
		name string
		run  func(i int)
	}{
		{"floor-create", func(i int) { check(load.RecordNewScript.Run(ctx, c, floorKey(i), "300000").Err()) }},
		{"acquire-new", func(i int) { acquire(i, "t1", false) }},
		{"floor-store", func(i int) { check(load.RecordDoneScript.Run(ctx, c, floorKey(i), "300000", meta, resp.Body).Err()) }},
		{"complete", func(i int) { check(s.Complete(ctx, key(i), "t1", resp, 5*time.Minute)) }},
		{"floor-read", func(i int) { check(load.RecordReadScript.Run(ctx, c, floorKey(i)).Err()) }},
		{"replay", func(i int) { acquire(i, "t2", false) }},
		{"replay-expiry", func(i int) { acquire(i, "t3", true) }},
	}
	// Untimed: loads every script.
	for _, sc := range scripts {
		sc.run(b.N)
	}
	calls := make([]int64, len(scripts))
	usec := make([]int64, len(scripts))
	b.ResetTimer()
	for from := 0; from < b.N; from += serverTimeBatch {
		for j, sc := range scripts {
			c0, u0 := evalshaStats(b, c)
			for i := from; i < min(from+serverTimeBatch, b.N); i++ {
				sc.run(i)
			}
			c1, u1 := evalshaStats(b, c)
			calls[j] += c1 - c0
			usec[j] += u1 - u0
		}
	}
	b.StopTimer()
	if failed != nil {
		b.Fatal(failed)
	}
	per := map[string]float64{}
	for j, sc := range scripts {
		per[sc.name] = float64(usec[j]) / float64(calls[j])
		b.ReportMetric(per[sc.name], sc.name+"-µs")
	}
	b.ReportMetric((per["acquire-new"]+per["complete"])/(per["floor-create"]+per["floor-store"]), "first/floor")
	b.ReportMetric(per["replay"]/per["floor-read"], "replay/floor")
}

// evalshaStats returns the calls and microseconds INFO commandstats counts
// for EVALSHA.
func evalshaStats(b *testing.B, c *redis.Client) (calls, usec int64) {
	info, err := load.Info(ctx, c, "commandstats")
	if err != nil {
		b.Fatal(err)
	}
	for _, kv := range strings.Split(info["cmdstat_evalsha"], ",") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "calls":
			calls, _ = strconv.ParseInt(v, 10, 64)
		case "usec":
			usec, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if calls == 0 {
		b.Fatal("INFO commandstats counts no EVALSHA")
	}
	return calls, usec
}
