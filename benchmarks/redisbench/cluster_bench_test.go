package redisbench

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/benchmarks/load"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/internal/wire"
	"github.com/redis/go-redis/v9"
)

// BenchmarkClusterPublish measures what completing a record that nobody
// watches costs a 3-master Cluster, against a complete that publishes every
// time, as this store did before complete published only for watched
// records: a Cluster sends each PUBLISH to every node. Each op runs two
// phases, in an order that alternates from op to op: 32 goroutines make 25
// first executions each (Acquire, then Complete with a 1 KiB body), with the
// store's own complete in one phase and with a copy of complete.lua that
// always publishes in the other. It reports the CPU time all nodes together
// spent per first execution in each (cpu-µs/fe@watched, cpu-µs/fe@always),
// the wall time per first execution (wall-µs/fe@...) and their ratio
// (watched/always). It starts its own cluster.
func BenchmarkClusterPublish(b *testing.B) {
	src := storeSource(b, "complete.lua")
	const conditional = "if s == 80 then redis.call('PUBLISH', key .. ':changed', 'complete') end"
	if !strings.Contains(src, conditional) {
		b.Fatalf("complete.lua no longer holds %q", conditional)
	}
	always := redis.NewScript(strings.Replace(src, conditional, "redis.call('PUBLISH', key .. ':changed', 'complete')", 1))

	cl := redistest.StartCluster(b, 3)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), PoolSize: 64})
	b.Cleanup(func() { cc.Close() })
	s := newStore(b, cc)
	resp := storeResponse(load.Payload(1 << 10))
	meta, err := wire.AppendMeta(nil, resp)
	if err != nil {
		b.Fatal(err)
	}
	// cpu is the CPU time all masters have used (serverCPU, summed).
	cpu := func() time.Duration {
		var mu sync.Mutex
		var total time.Duration
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			used := serverCPU(b, c)
			mu.Lock()
			total += used
			mu.Unlock()
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		return total
	}
	complete := [2]func(key, token string) error{
		func(key, token string) error { return s.Complete(ctx, key, token, resp, 5*time.Minute) },
		func(key, token string) error {
			rkey := s.RecordKey(key)
			// The arguments complete.lua takes: the token as the record's
			// head spells it, the TTL in ms, and the payload (the meta
			// block's length as a uvarint, the meta block, the body).
			payload := append(binary.AppendUvarint(nil, uint64(len(meta))), meta...)
			payload = append(payload, resp.Body...)
			tag := strconv.Itoa(len(token)) + ":" + token
			reply, err := always.Run(ctx, cc, []string{rkey}, tag, "300000", payload).Slice()
			if err == nil && (len(reply) != 1 || reply[0] != int64(1)) {
				err = fmt.Errorf("complete %s: reply %v", rkey, reply)
			}
			return err
		},
	}
	const goroutines, perPhase = 32, 25
	prefix := redistest.Prefix()
	var cpuUsed, wall [2]time.Duration
	var failed atomic.Value
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range 2 {
			k := (i + j) % 2
			c0 := cpu()
			wall[k] += runPhase(goroutines, perPhase, func(g, r int) {
				key := prefix + strconv.Itoa(((i*2+k)*goroutines+g)*perPhase+r)
				_, err := s.Acquire(ctx, storeReq(key, "t1"))
				if err == nil {
					err = complete[k](key, "t1")
				}
				if err != nil {
					failed.CompareAndSwap(nil, err.Error())
				}
			})
			cpuUsed[k] += cpu() - c0
		}
	}
	b.StopTimer()
	if msg := failed.Load(); msg != nil {
		b.Fatal(msg)
	}
	fes := float64(b.N * goroutines * perPhase)
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / fes }
	b.ReportMetric(us(cpuUsed[0]), "cpu-µs/fe@watched")
	b.ReportMetric(us(cpuUsed[1]), "cpu-µs/fe@always")
	b.ReportMetric(us(wall[0]), "wall-µs/fe@watched")
	b.ReportMetric(us(wall[1]), "wall-µs/fe@always")
	b.ReportMetric(float64(cpuUsed[0])/float64(cpuUsed[1]), "watched/always")
}
