package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/memstore"
	"github.com/go-idempotency/idempotency/redisstore"
)

// linConfig shapes a randomized concurrent history.
type linConfig struct {
	clients  int
	ops      int // per client
	keys     []linKey
	lease    time.Duration
	maxPause time.Duration
}

type linKey struct {
	name string
	ttl  time.Duration
}

// defaultLin: 6 clients x 150 operations on 3 records, two of which have
// TTLs short enough to expire (COMPLETE and IN_PROGRESS) during the run, so
// that records cycle through every state many times.
// Leases are short so that steals, expired completes and lost extends all
// happen; pauses between operations let leases run out.
var defaultLin = linConfig{
	clients: 6,
	ops:     150,
	keys: []linKey{
		{"a", time.Hour},
		{"b", 150 * time.Millisecond},
		{"c", 60 * time.Millisecond},
	},
	lease:    30 * time.Millisecond,
	maxPause: 8 * time.Millisecond,
}

// history records operations from many goroutines.
type history struct {
	base time.Time
	mu   sync.Mutex
	ops  []porcupine.Operation
	errs []error // unexpected errors, reported by the test
}

func (h *history) now() int64 { return int64(time.Since(h.base)) }

func (h *history) add(client int, in linIn, out linOut, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Output: out, Call: in.call, Return: in.ret})
	if out.err == errOther {
		h.errs = append(h.errs, fmt.Errorf("%s by %s: %w", opNames[in.kind], in.token, err))
	}
}

func classify(err error) errKind {
	switch {
	case err == nil:
		return errNone
	case errors.Is(err, idempotency.ErrLeaseLost):
		return errLeaseLost
	}
	return errOther
}

// do runs one operation against s and records it.
func (h *history) do(ctx context.Context, s idempotency.Store, client int, in linIn) linOut {
	var out linOut
	var err error
	in.call = h.now()
	switch in.kind {
	case opAcquire:
		var a idempotency.Acquisition
		a, err = s.Acquire(ctx, idempotency.AcquireRequest{Key: in.key, Token: in.token, Fingerprint: in.fp, Lease: in.lease, TTL: in.ttl})
		out = linOut{outcome: a.Outcome, epoch: a.Epoch, remaining: a.LeaseRemaining}
		if a.Response != nil {
			out.body = string(a.Response.Body)
		}
	case opComplete:
		err = s.Complete(ctx, in.key, in.token, &idempotency.Response{Status: 201, Body: []byte(in.body)}, in.ttl)
	case opRelease:
		err = s.Release(ctx, in.key, in.token)
	case opExtend:
		err = s.Extend(ctx, in.key, in.token, in.lease)
	}
	in.ret = h.now()
	out.err = classify(err)
	h.add(client, in, out, err)
	return out
}

// runHistory drives cfg.clients goroutines of random operations against s
// and returns the history. Each client works on attempts: an attempt has a
// token and a fingerprint and acquires, extends, completes or releases; it
// sometimes starts a new attempt (a new token) on a random record. Keys are
// unique to the run.
func runHistory(t *testing.T, s idempotency.Store, cfg linConfig, seed uint64) *history {
	t.Helper()
	run := fmt.Sprintf("%x", seed)
	h := &history{base: time.Now()}
	ctx := context.Background()
	var wg sync.WaitGroup
	for c := 0; c < cfg.clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(c)))
			type attempt struct {
				key   linKey
				token string
				fp    string
			}
			n := 0
			newAttempt := func() attempt {
				n++
				k := cfg.keys[rng.IntN(len(cfg.keys))]
				fp := "fp-A"
				if rng.IntN(6) == 0 {
					fp = "fp-B"
				}
				return attempt{key: k, token: fmt.Sprintf("c%d-%d", c, n), fp: fp}
			}
			cur := newAttempt()
			for i := 0; i < cfg.ops; i++ {
				key := idempotency.StorageKey(run, cur.key.name)
				in := linIn{key: key, token: cur.token, fp: cur.fp, lease: cfg.lease, ttl: cur.key.ttl}
				switch r := rng.IntN(100); {
				case r < 35:
					in.kind = opAcquire
				case r < 60:
					in.kind = opComplete
					in.body = fmt.Sprintf("%s#%d", cur.token, i)
				case r < 75:
					in.kind = opExtend
				case r < 85:
					in.kind = opRelease
				default:
					cur = newAttempt()
					in.key = idempotency.StorageKey(run, cur.key.name)
					in.token, in.fp, in.ttl = cur.token, cur.fp, cur.key.ttl
					in.kind = opAcquire
				}
				h.do(ctx, s, c, in)
				if p := rng.Int64N(int64(cfg.maxPause) + 1); p > 0 {
					time.Sleep(time.Duration(p)) // workload pacing, lets leases run out
				}
			}
		}(c)
	}
	wg.Wait()
	return h
}

// check runs porcupine on h and returns the result; an illegal history
// that was not expected is drawn to a file for inspection (the broken
// store's, which the checker must reject, is not: it would be left behind
// on every run).
func check(t *testing.T, h *history, expectIllegal bool) porcupine.CheckResult {
	t.Helper()
	model := storeModel.ToModel()
	res, info := porcupine.CheckOperationsVerbose(model, h.ops, 60*time.Second)
	if res == porcupine.Illegal && !expectIllegal {
		path := filepath.Join(os.TempDir(), fmt.Sprintf("idempotency-linearizability-%d.html", time.Now().UnixNano()))
		if err := porcupine.VisualizePath(model, info, path); err == nil {
			t.Logf("history drawn to %s", path)
		}
	}
	return res
}

// checkLinearizable runs a history against s, checks it and reports.
func checkLinearizable(t *testing.T, storeName string, s idempotency.Store, cfg linConfig) {
	t.Helper()
	seed := rand.Uint64()
	h := runHistory(t, s, cfg, seed)
	for _, err := range h.errs {
		t.Errorf("unexpected store error: %v", err)
	}
	res := check(t, h, false)
	var violations int64
	if res != porcupine.Ok {
		violations = 1
	}
	reliability.Report(t, reliability.Result{
		Scenario: "linearizability", Store: storeName,
		Operations: int64(len(h.ops)), Violations: violations,
	})
	if res != porcupine.Ok {
		t.Fatalf("history of %d operations (seed %#x) is %s, want Ok", len(h.ops), seed, res)
	}
	t.Logf("%d operations (seed %#x): linearizable; %s", len(h.ops), seed, outcomeCounts(h))
}

// outcomeCounts summarizes what a history exercised.
func outcomeCounts(h *history) string {
	counts := map[string]int{}
	for _, op := range h.ops {
		in, out := op.Input.(linIn), op.Output.(linOut)
		name := opNames[in.kind]
		switch {
		case out.err == errLeaseLost:
			name += ":lease_lost"
		case in.kind == opAcquire:
			name += ":" + out.outcome.String()
		}
		counts[name]++
	}
	return fmt.Sprint(counts)
}

func TestLinearizableMemstore(t *testing.T) {
	s := memstore.New(memstore.WithSweepInterval(20 * time.Millisecond))
	t.Cleanup(func() { s.Close() })
	for i := 0; i < 2; i++ {
		checkLinearizable(t, "memstore", s, defaultLin)
	}
}

func TestLinearizableRedis(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.Addr(t)})
	t.Cleanup(func() { c.Close() })
	s := redisstore.New(c, redisstore.WithPrefix(redistest.Prefix()))
	t.Cleanup(func() { s.Close() })
	for i := 0; i < 2; i++ {
		checkLinearizable(t, "redis", s, defaultLin)
	}
}

func TestLinearizablePostgres(t *testing.T) {
	s := newPgStore(t)
	for i := 0; i < 2; i++ {
		checkLinearizable(t, "postgres", s, defaultLin)
	}
}

func TestLinearizableRedisCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { c.Close() })
	s := redisstore.New(c, redisstore.WithPrefix(redistest.Prefix()))
	t.Cleanup(func() { s.Close() })
	cfg := defaultLin
	// More records, so that they spread over the masters.
	cfg.keys = []linKey{{"a", time.Hour}, {"b", 150 * time.Millisecond}, {"c", 60 * time.Millisecond}, {"d", 100 * time.Millisecond}, {"e", time.Hour}}
	checkLinearizable(t, "redis-cluster", s, cfg)
}

// overwritingStore is a deliberately broken store: its Complete skips the
// lease check. A stale owner's Complete is written through under the
// current holder's token, overwriting the new owner's record.
type overwritingStore struct {
	idempotency.Store
	mu      sync.Mutex
	holder  map[string]string
	written atomic.Int64 // stale completes written through
}

func (s *overwritingStore) Acquire(ctx context.Context, req idempotency.AcquireRequest) (idempotency.Acquisition, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, err := s.Store.Acquire(ctx, req)
	if err == nil && (a.Outcome == idempotency.Acquired || a.Outcome == idempotency.Stolen) {
		s.holder[req.Key] = req.Token
	}
	return a, err
}

func (s *overwritingStore) Complete(ctx context.Context, key, token string, resp *idempotency.Response, ttl time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h, ok := s.holder[key]; ok && h != token {
		if err := s.Store.Complete(ctx, key, h, resp, ttl); err == nil {
			s.written.Add(1)
			return nil
		}
	}
	return s.Store.Complete(ctx, key, token, resp, ttl)
}

// scriptedSteal appends to h, one operation at a time, the sequence a stale
// owner goes through: A acquires, its lease runs out, B steals, A
// completes, C looks the record up.
func scriptedSteal(h *history, s idempotency.Store, key string) {
	ctx := context.Background()
	lease := 20 * time.Millisecond
	h.do(ctx, s, 0, linIn{key: key, kind: opAcquire, token: "A", fp: "fp", lease: lease, ttl: time.Hour})
	time.Sleep(lease + 2*time.Duration(skew)) // the lease must be over on any clock
	h.do(ctx, s, 1, linIn{key: key, kind: opAcquire, token: "B", fp: "fp", lease: time.Hour, ttl: time.Hour})
	h.do(ctx, s, 0, linIn{key: key, kind: opComplete, token: "A", body: "A's response", ttl: time.Hour})
	h.do(ctx, s, 1, linIn{key: key, kind: opComplete, token: "B", body: "B's response", ttl: time.Hour})
	h.do(ctx, s, 2, linIn{key: key, kind: opAcquire, token: "C", fp: "fp", lease: lease, ttl: time.Hour})
}

// TestCheckerRejectsBrokenStore shows that the check bites: the same
// workload on a store whose Complete skips the lease check is rejected,
// while the real store passes the scripted steal.
func TestCheckerRejectsBrokenStore(t *testing.T) {
	inner := memstore.New()
	t.Cleanup(func() { inner.Close() })
	broken := &overwritingStore{Store: inner, holder: map[string]string{}}
	h := runHistory(t, broken, defaultLin, rand.Uint64())
	scriptedSteal(h, broken, idempotency.StorageKey("scripted", "broken"))
	if broken.written.Load() == 0 {
		t.Fatal("the broken store never wrote a stale completion through")
	}
	res := check(t, h, true)
	reliability.Report(t, reliability.Result{
		Scenario: "linearizability: broken store rejected", Store: "broken",
		Operations: int64(len(h.ops)), Faults: broken.written.Load(),
		Caught:     map[bool]int64{true: 1}[res == porcupine.Illegal],
		Violations: map[bool]int64{true: 1}[res != porcupine.Illegal],
	})
	if res != porcupine.Illegal {
		t.Fatalf("the checker found the broken store's history %s, want Illegal", res)
	}

	good := memstore.New()
	t.Cleanup(func() { good.Close() })
	h = &history{base: time.Now()}
	scriptedSteal(h, good, idempotency.StorageKey("scripted", "good"))
	if res := check(t, h, false); res != porcupine.Ok {
		t.Fatalf("the real store's scripted steal is %s, want Ok", res)
	}
}

// TestModel checks the model on hand-written histories.
func TestModel(t *testing.T) {
	ms := int64(time.Millisecond)
	lease := 30 * time.Millisecond
	acq := func(token string, call, ret int64, out linOut) porcupine.Operation {
		in := linIn{key: "k", kind: opAcquire, token: token, fp: "fp", lease: lease, ttl: time.Hour, call: call * ms, ret: ret * ms}
		return porcupine.Operation{Input: in, Output: out, Call: in.call, Return: in.ret}
	}
	cpl := func(token, body string, call, ret int64, err errKind) porcupine.Operation {
		in := linIn{key: "k", kind: opComplete, token: token, body: body, ttl: time.Hour, call: call * ms, ret: ret * ms}
		return porcupine.Operation{Input: in, Output: linOut{err: err}, Call: in.call, Return: in.ret}
	}
	acquired := linOut{outcome: idempotency.Acquired, epoch: 1}
	cases := []struct {
		name string
		ops  []porcupine.Operation
		ok   bool
	}{
		{"acquire, complete, replay", []porcupine.Operation{
			acq("A", 0, 1, acquired), cpl("A", "x", 2, 3, errNone),
			acq("B", 4, 5, linOut{outcome: idempotency.Completed, body: "x"})}, true},
		{"two first leases at once", []porcupine.Operation{
			acq("A", 0, 1, acquired), acq("B", 2, 3, acquired)}, false},
		{"in flight while the lease runs", []porcupine.Operation{
			acq("A", 0, 1, acquired), acq("B", 10, 11, linOut{outcome: idempotency.InFlight, epoch: 1, remaining: 20 * time.Millisecond})}, true},
		{"in flight long after the lease", []porcupine.Operation{
			acq("A", 0, 1, acquired), acq("B", 100, 101, linOut{outcome: idempotency.InFlight, epoch: 1, remaining: time.Millisecond})}, false},
		{"stolen before the lease could end", []porcupine.Operation{
			acq("A", 0, 1, acquired), acq("B", 5, 6, linOut{outcome: idempotency.Stolen, epoch: 2})}, false},
		{"stolen after the lease", []porcupine.Operation{
			acq("A", 0, 1, acquired), acq("B", 40, 41, linOut{outcome: idempotency.Stolen, epoch: 2}),
			cpl("A", "a", 42, 43, errLeaseLost), cpl("B", "b", 44, 45, errNone),
			acq("C", 46, 47, linOut{outcome: idempotency.Completed, body: "b"})}, true},
		{"stale owner completes", []porcupine.Operation{
			acq("A", 0, 1, acquired), acq("B", 40, 41, linOut{outcome: idempotency.Stolen, epoch: 2}),
			cpl("A", "a", 42, 43, errNone)}, false},
		{"replay of a payload never stored", []porcupine.Operation{
			acq("A", 0, 1, acquired), cpl("A", "a", 2, 3, errNone),
			acq("B", 4, 5, linOut{outcome: idempotency.Completed, body: "other"})}, false},
		{"concurrent complete and replay", []porcupine.Operation{
			acq("A", 0, 1, acquired), cpl("A", "a", 2, 10, errNone),
			acq("B", 3, 4, linOut{outcome: idempotency.Completed, body: "a"})}, true},
	}
	model := storeModel.ToModel()
	for _, tc := range cases {
		if got := porcupine.CheckOperations(model, tc.ops); got != tc.ok {
			t.Errorf("%s: linearizable = %v, want %v", tc.name, got, tc.ok)
		}
	}
}
