package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/benchmarks/load"
	"github.com/go-idempotency/idempotency/redisstore"
	"github.com/redis/go-redis/v9"
)

// scriptCosts is the server-side time of one EVALSHA of each script, from
// the change in INFO commandstats over many calls, and the number of Redis
// commands the script runs for that edge.
type scriptCosts struct {
	rows []scriptCost
}

type scriptCost struct {
	name     string
	calls    int    // Redis commands run inside the script
	commands string // which
	usec     float64
}

// scriptCalls is how many times measureScripts runs each edge, in batches
// of scriptBatch keys.
const (
	scriptCalls = 3000
	scriptBatch = 100
)

// scriptPasses is how many times measureScripts measures every edge. Each
// row is the median of its passes: on a shared machine one pass can meet a
// burst of other work, which the interleaving spreads over all rows only
// roughly.
const scriptPasses = 5

// measureScripts runs each store edge many times, one call at a time, on a
// private redis-server (or REDIS_ADDR, under a fresh prefix) and reads the
// EVALSHA time per call the server accounted, in scriptPasses passes; a
// row's time is the median of the passes.
func measureScripts(ctx context.Context) (*scriptCosts, error) {
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		srv, err := load.StartRedis()
		if err != nil {
			return nil, err
		}
		defer srv.Stop()
		addr = srv.Addr
	}
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	var b [8]byte
	_, _ = rand.Read(b[:])
	var passes []*scriptCosts
	for p := range scriptPasses {
		prefix := "report:" + hex.EncodeToString(b[:]) + ":" + strconv.Itoa(p) + ":"
		costs, err := measureScriptsPass(ctx, c, prefix)
		if err != nil {
			return nil, err
		}
		passes = append(passes, costs)
	}
	out := &scriptCosts{}
	for j, r := range passes[0].rows {
		us := make([]float64, len(passes))
		for p, costs := range passes {
			us[p] = costs.rows[j].usec
		}
		slices.Sort(us)
		r.usec = us[len(us)/2]
		out.rows = append(out.rows, r)
	}
	return out, nil
}

// measureScriptsPass measures every edge once, on records under prefix.
func measureScriptsPass(ctx context.Context, c *redis.Client, prefix string) (*scriptCosts, error) {
	s := redisstore.New(c, redisstore.WithPrefix(prefix), redisstore.WithoutStartupCheck())
	defer s.Close()

	const n = scriptCalls
	resp := &idempotency.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: load.Payload(1024)}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%064d", i)
	}
	acq := func(key, token string) idempotency.AcquireRequest {
		return idempotency.AcquireRequest{Key: key, Token: token, Fingerprint: "fp", Lease: time.Minute, TTL: 5 * time.Minute}
	}
	// The record floors' records, beside the store's, with a meta block of
	// the store's size.
	floorKey := func(i int) string { return prefix + "floor:" + keys[i] }
	const ttl = "300000"
	meta := strings.Repeat("m", 40)
	var firstErr error
	check := func(err error) {
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	phases := []struct {
		name, commands string
		calls          int
		f              func(i int)
	}{
		{"floor (return {1})", "none", 0, func(int) { check(load.FloorScript.Run(ctx, c, []string{prefix + "floor"}).Err()) }},
		{"record floor: create a record", "HSET, PEXPIRE", 2, func(i int) { check(load.RecordNewScript.Run(ctx, c, []string{floorKey(i)}, ttl).Err()) }},
		{"acquire, new key", "HGET, HGETALL, TIME, HSET, PEXPIRE", 5, func(i int) { _, err := s.Acquire(ctx, acq(keys[i], "t1")); check(err) }},
		{"record floor: store a 1 KiB payload", "HSET, PEXPIRE", 2, func(i int) {
			check(load.RecordDoneScript.Run(ctx, c, []string{floorKey(i)}, ttl, meta, resp.Body).Err())
		}},
		{"complete, 1 KiB body, no waiter", "HGET, HSET, PEXPIRE", 3, func(i int) { check(s.Complete(ctx, keys[i], "t1", resp, 5*time.Minute)) }},
		{"record floor: read the payload", "HMGET", 1, func(i int) { check(load.RecordReadScript.Run(ctx, c, []string{floorKey(i)}).Err()) }},
		{"acquire, replay (1 KiB)", "HGET", 1, func(i int) { _, err := s.Acquire(ctx, acq(keys[i], "t2")); check(err) }},
		{"acquire, replay asked for its expiry (replaycache's miss)", "HGET, PTTL", 2, func(i int) {
			r := acq(keys[i], "t3")
			r.WantExpiresIn = true
			_, err := s.Acquire(ctx, r)
			check(err)
		}},
	}
	// The phases run interleaved, a batch of keys at a time through all of
	// them in order: run one after another, each would meet its own share
	// of the server's background (the keyspace's hash table grows, and
	// rehashes, while one phase adds keys; the machine's load drifts).
	calls := make([]int64, len(phases))
	usec := make([]int64, len(phases))
	for b := 0; b < n; b += scriptBatch {
		for j, p := range phases {
			calls0, usec0, err := evalshaStats(ctx, c)
			if err != nil {
				return nil, err
			}
			for i := b; i < min(b+scriptBatch, n); i++ {
				p.f(i)
			}
			calls1, usec1, err := evalshaStats(ctx, c)
			if err != nil {
				return nil, err
			}
			calls[j] += calls1 - calls0
			usec[j] += usec1 - usec0
		}
	}
	out := &scriptCosts{}
	for j, p := range phases {
		if calls[j] <= 0 {
			return nil, fmt.Errorf("commandstats did not count the %s calls", p.name)
		}
		out.rows = append(out.rows, scriptCost{name: p.name, calls: p.calls, commands: p.commands, usec: float64(usec[j]) / float64(calls[j])})
	}
	if firstErr != nil {
		return nil, firstErr
	}
	// Records expire by themselves; delete them now all the same.
	for i := range keys {
		c.Unlink(ctx, s.RecordKey(keys[i]), floorKey(i))
	}
	return out, nil
}

// evalshaStats returns the calls and microseconds INFO commandstats counts
// for EVALSHA.
func evalshaStats(ctx context.Context, c *redis.Client) (calls, usec int64, err error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:")
		if !ok {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
	}
	return calls, usec, nil
}

// scriptTargets judges the server time of the store's scripts against the
// record floor's for the same step: a first execution (acquire of a new
// key, then complete) within 1.2× of the floor's two scripts (create, then
// store), a replay within 1.1× of the floor's read.
func (ms *measured) scriptTargets() [][]string {
	if ms.scripts == nil {
		return nil
	}
	usec := map[string]float64{}
	for _, r := range ms.scripts.rows {
		usec[r.name] = r.usec
	}
	judge := func(target string, limit float64, store, floor []string) []string {
		var s, f float64
		for _, n := range store {
			s += usec[n]
		}
		for _, n := range floor {
			f += usec[n]
		}
		if s == 0 || f == 0 {
			return []string{target, "not measured in this run", "–"}
		}
		return []string{target, fmt.Sprintf("%.2f× (%.1f µs against %.1f µs of server time per request)", s/f, s, f), verdict(s/f <= limit)}
	}
	return [][]string{
		judge("Redis server time per first execution ≤ 1.2× the record floor's two scripts", 1.2,
			[]string{"acquire, new key", "complete, 1 KiB body, no waiter"},
			[]string{"record floor: create a record", "record floor: store a 1 KiB payload"}),
		judge("Redis server time per replay ≤ 1.1× the record floor's read", 1.1,
			[]string{"acquire, replay (1 KiB)"},
			[]string{"record floor: read the payload"}),
	}
}
