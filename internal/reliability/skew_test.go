package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/redisstore"
)

// The skew scenarios run a master with the machine's clock and a replica
// whose clock is offset (redistest.StartSkewed). A lease is written with
// the master's TIME and replicated as it is; once the replica is promoted it
// judges that lease by its own clock. A replica ahead by S sees a lease that
// was extended `age` ago with lease − age − S left: S eats into the lease.

// topologyLongEnv names the environment variable that turns on the long
// versions of the topology scenarios (more skews, more runs).
const topologyLongEnv = "IDEMPOTENCY_TOPOLOGY_LONG"

func topologyLong() bool { return os.Getenv(topologyLongEnv) == "1" }

// leaseEnd parses a record's lease field (the lease's end in Unix
// milliseconds: 1 to 15 decimal digits, no leading zero) into the moment
// the lease ends on the clock of the server that wrote it.
func leaseEnd(field string) (time.Time, error) {
	if len(field) == 0 || len(field) > 15 || field[0] == '0' || strings.Trim(field, "0123456789") != "" {
		return time.Time{}, fmt.Errorf("lease field %q", field)
	}
	ms, err := strconv.ParseInt(field, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("lease field %q", field)
	}
	return time.UnixMilli(ms), nil
}

// leaseScript reads the record at KEYS[1] as the server holds it: its
// holder's token, and its lease's end in Unix milliseconds, from its head
// (see redisstore/README.md, Record layout). It answers nothing when there
// is no record.
const leaseScript = `
local h = redis.call('HGET', KEYS[1], 'h')
if not h then return {} end
local tl, ti = string.match(h, '^[pPc](%d+):()')
local at = string.match(h, '^%d+:(%d+):', ti + tl)
return {string.sub(h, ti, ti + tl - 1), at}`

// readLease returns the token and the lease's end, in Unix milliseconds as
// a decimal string, of the record at rkey on the server at addr; both are
// empty when there is no record.
func readLease(addr, rkey string) (token, lease string, err error) {
	reply, err := redistest.Do(addr, "EVAL", leaseScript, "1", rkey)
	if err != nil {
		return "", "", err
	}
	token, lease, _ = strings.Cut(reply, "\n")
	return token, lease, nil
}

// leaseLeft returns how much of the lease in the record at rkey the server
// at addr sees left, by its own TIME (negative once it ran out).
func leaseLeft(t testing.TB, addr, rkey string) time.Duration {
	t.Helper()
	_, field, err := readLease(addr, rkey)
	if err != nil {
		t.Fatal(err)
	}
	end, err := leaseEnd(field)
	if err != nil {
		t.Fatal(err)
	}
	reply, err := redistest.Do(addr, "TIME")
	if err != nil {
		t.Fatal(err)
	}
	now, err := redistest.ParseTime(reply)
	if err != nil {
		t.Fatal(err)
	}
	return end.Sub(now)
}

// TestSkewLeaseJudgedByNewMaster takes leases on a master, lets them
// replicate to a replica whose clock is skewed, promotes the replica and
// sends a duplicate acquire to it. The replica's copy of the lease field is
// the master's, byte for byte, and the new master judges it by its own
// clock: a lease extended `age` ago has lease − age − skew left there. One
// record is extended just before the promotion (age ≈ 0), the other a
// heartbeat interval before it (age ≈ lease/3, the most a healthy heartbeat
// lets pass); the duplicate must be refused with that much left, or steal
// when it is gone. So a lease survives a skew of up to the lease less the
// longest time between two heartbeats the new master receives: 2/3 of the
// lease when the failover loses no heartbeat (TestSkewSentinelFailover
// measures what a Sentinel failover loses).
func TestSkewLeaseJudgedByNewMaster(t *testing.T) {
	t.Parallel()
	const lease = 3 * time.Second
	const margin = 250 * time.Millisecond // round trips, replication, timers
	skews := []time.Duration{-2 * time.Second, 500 * time.Millisecond, 1500 * time.Millisecond,
		2500 * time.Millisecond, 4 * time.Second}
	var mu sync.Mutex
	seen := map[time.Duration]string{} // skew -> what the new master did
	t.Cleanup(func() {
		if len(seen) == 0 {
			return // skipped or failed
		}
		parts := make([]string, 0, len(skews))
		for _, skew := range skews {
			if v, ok := seen[skew]; ok {
				parts = append(parts, fmt.Sprintf("skew %v: %s", skew, v))
			}
		}
		reliability.Report(t, reliability.Result{Scenario: "clock skew: lease judged by a promoted replica", Store: "redis",
			Operations: int64(7 * len(seen)), Faults: int64(len(seen)),
			Note: fmt.Sprintf("lease %v; a lease extended %v / just before the promotion: %s", lease, lease/3, strings.Join(parts, ", "))})
	})
	for _, skew := range skews {
		t.Run("skew="+skew.String(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			m := redistest.Start(t)
			r := redistest.StartSkewedReplica(t, m.Addr(), skew)
			prefix := redistest.Prefix()
			onM := newRedisStoreWithPrefix(t, fastClient(t, m.Addr()), prefix)
			onR := newRedisStoreWithPrefix(t, fastClient(t, r.Addr()), prefix)
			acquire := func(s *redisstore.Store, key, token string) idempotency.Acquisition {
				t.Helper()
				a, err := s.Acquire(ctx, idempotency.AcquireRequest{Key: key, Token: token, Fingerprint: "fp",
					Lease: lease, TTL: time.Hour})
				if err != nil {
					t.Fatalf("acquire %s with %s: %v", key, token, err)
				}
				return a
			}
			// "old" is extended a heartbeat interval before the promotion,
			// "fresh" right before it.
			acquire(onM, "old", "holder")
			acquire(onM, "fresh", "holder")
			if err := onM.Extend(ctx, "old", "holder", lease); err != nil {
				t.Fatal(err)
			}
			oldAt := time.Now()
			time.Sleep(lease/3 - time.Since(oldAt))
			if err := onM.Extend(ctx, "fresh", "holder", lease); err != nil {
				t.Fatal(err)
			}
			freshAt := time.Now()
			for _, key := range []string{"old", "fresh"} {
				rkey := onM.RecordKey(key)
				_, want, err := readLease(m.Addr(), rkey)
				if err != nil {
					t.Fatal(err)
				}
				if !redistest.WaitFor(2*time.Second, func() bool {
					_, got, err := readLease(r.Addr(), rkey)
					return err == nil && got == want
				}) {
					t.Fatalf("the replica's lease field of %s never became the master's %q", key, want)
				}
			}
			if _, err := redistest.Do(r.Addr(), "REPLICAOF", "NO", "ONE"); err != nil {
				t.Fatal(err)
			}
			leftOnM := leaseLeft(t, m.Addr(), onM.RecordKey("fresh"))
			leftOnR := leaseLeft(t, r.Addr(), onM.RecordKey("fresh"))
			if d := leftOnM - leftOnR - skew; d < -margin || d > margin {
				t.Errorf("the old master sees %v left, the new one %v: want them %v apart", leftOnM, leftOnR, skew)
			}
			var notes []string
			for _, c := range []struct {
				key string
				at  time.Time
			}{{"old", oldAt}, {"fresh", freshAt}} {
				age := time.Since(c.at)
				want := lease - age - skew // what the new master should see left
				got := acquire(onR, c.key, "duplicate")
				switch {
				case want > margin:
					if got.Outcome != idempotency.InFlight {
						t.Errorf("%s (extended %v ago): the duplicate got %v, want in flight with %v left", c.key, age.Round(time.Millisecond), got.Outcome, want.Round(time.Millisecond))
					} else if d := got.LeaseRemaining - want; d < -margin || d > margin {
						t.Errorf("%s: the new master reports %v left, want about %v (lease %v − age %v − skew %v)",
							c.key, got.LeaseRemaining, want.Round(time.Millisecond), lease, age.Round(time.Millisecond), skew)
					}
				case want < -margin:
					if got.Outcome != idempotency.Stolen {
						t.Errorf("%s (extended %v ago): the duplicate got %v, want it to steal (%v left by the new master's clock)", c.key, age.Round(time.Millisecond), got.Outcome, want.Round(time.Millisecond))
					}
				}
				outcome := fmt.Sprintf("%v left", got.LeaseRemaining.Round(10*time.Millisecond))
				if got.Outcome == idempotency.Stolen {
					outcome = "stolen"
				}
				notes = append(notes, outcome)
			}
			if !t.Failed() {
				mu.Lock()
				seen[skew] = strings.Join(notes, " / ")
				mu.Unlock()
			}
		})
	}
}

// skewRun is the outcome of one skewed failover under the middleware.
type skewRun struct {
	skew, lease time.Duration
	stolen      bool          // a duplicate ran while the holder's record was IN_PROGRESS
	overlap     time.Duration // how long the holder's handler ran on after the duplicate started
	// gap is the time from the last heartbeat the replica had before its
	// promotion to the holder's first heartbeat on the new master: the new
	// master saw lease − gap − skew left at its lowest.
	gap          time.Duration
	leftAtSwitch time.Duration // the holder's lease left by the new master's clock, at the promotion
	executions   int
	ops          int
}

// predicted reports whether the model says a duplicate steals: the new
// master's view of the lease ran out before the holder's first heartbeat
// reached it.
func (r skewRun) predicted() bool { return r.skew > r.lease-r.gap }

func (r skewRun) String() string {
	s := fmt.Sprintf("skew %v: ", r.skew)
	if r.stolen {
		s += fmt.Sprintf("stolen, the holder's handler ran on for %v", r.overlap.Round(10*time.Millisecond))
	} else {
		s += "409 until the holder completed"
	}
	return s + fmt.Sprintf(" (new master saw %v left at the promotion; heartbeat gap %v)",
		r.leftAtSwitch.Round(10*time.Millisecond), r.gap.Round(10*time.Millisecond))
}

// extendLog is a Store that notes when each Extend was sent and how it
// ended.
type extendLog struct {
	idempotency.Store
	mu    sync.Mutex
	calls []extendCall
}

type extendCall struct {
	sent time.Time
	err  error
}

func (l *extendLog) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	sent := time.Now()
	err := l.Store.Extend(ctx, key, token, lease)
	l.mu.Lock()
	l.calls = append(l.calls, extendCall{sent, err})
	l.mu.Unlock()
	return err
}

// firstLost returns when the first Extend that was refused with
// ErrLeaseLost was sent.
func (l *extendLog) firstLost() (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.calls {
		if errors.Is(c.err, idempotency.ErrLeaseLost) {
			return c.sent, true
		}
	}
	return time.Time{}, false
}

// sentinelInstance is newInstance over a Sentinel-aware client whose faults
// surface fast; wrap, when not nil, wraps its store.
func sentinelInstance(t *testing.T, name string, sentinels []string, prefix string, lease time.Duration, h http.Handler,
	wrap func(idempotency.Store) idempotency.Store) *instance {
	t.Helper()
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    name,
		SentinelAddrs: sentinels,
		DialTimeout:   200 * time.Millisecond,
		ReadTimeout:   300 * time.Millisecond,
		WriteTimeout:  300 * time.Millisecond,
		PoolTimeout:   300 * time.Millisecond,
		MaxRetries:    2,
	})
	t.Cleanup(func() { c.Close() })
	in := &instance{ev: &events{}}
	var store idempotency.Store = newRedisStoreWithPrefix(t, c, prefix)
	if wrap != nil {
		store = wrap(store)
	}
	srv, client := serve(t, idempotency.New(store, idempotency.WithLease(lease), idempotency.WithObserver(in.ev.observe))(h))
	in.url, in.client = srv.URL+"/pay", client
	return in
}

// leaseWatch polls a record's token and lease field on one server and keeps
// every change with the moment it was seen.
type leaseWatch struct {
	mu      sync.Mutex
	changes []leaseChange
	stop    chan struct{}
	done    chan struct{}
}

type leaseChange struct {
	at           time.Time
	token, lease string
}

func watchLease(addr, rkey string) *leaseWatch {
	w := &leaseWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		last := ""
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			token, lease, err := readLease(addr, rkey)
			if err != nil || token+"\n"+lease == last {
				continue
			}
			last = token + "\n" + lease
			if token == "" {
				continue // no record yet
			}
			w.mu.Lock()
			w.changes = append(w.changes, leaseChange{at: time.Now(), token: token, lease: lease})
			w.mu.Unlock()
		}
	}()
	return w
}

// seen returns the changes seen so far.
func (w *leaseWatch) seen() []leaseChange {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]leaseChange(nil), w.changes...)
}

func (w *leaseWatch) end() []leaseChange {
	close(w.stop)
	<-w.done
	return w.seen()
}

// renewedAfter returns the first renewal of holder's lease seen after at.
func renewedAfter(changes []leaseChange, holder string, at time.Time) (leaseChange, bool) {
	for _, c := range changes {
		if c.token == holder && c.at.After(at) {
			return c, true
		}
	}
	return leaseChange{}, false
}

// lastBefore returns the last renewal of holder's lease seen before at.
func lastBefore(changes []leaseChange, holder string, at time.Time) (leaseChange, bool) {
	var last leaseChange
	found := false
	for _, c := range changes {
		if c.token == holder && !c.at.After(at) {
			last, found = c, true
		}
	}
	return last, found
}

// leaseWritten returns the server time at which a lease field of a lease of
// length lease was written: its end less the lease.
func leaseWritten(field string, lease time.Duration) time.Time {
	end, err := leaseEnd(field)
	if err != nil {
		return time.Time{}
	}
	return end.Add(-lease)
}

// runSkewedFailover runs one failover under the middleware. A master with
// the machine's clock, a replica ahead by skew and a sentinel; two
// application instances A and B over Sentinel-aware clients. A's handler
// runs and blocks with its heartbeat going; a phase into a heartbeat
// interval the sentinel is told to fail over; from the replica's promotion
// on, B sends a duplicate every 50ms until one runs or A's heartbeat has
// reached the new master, then A's handler is let go (after a steal, once
// A's context is cancelled). The run records whether a duplicate ran while
// A's handler was still running, and the heartbeat gap the new master saw.
func runSkewedFailover(t *testing.T, skew, lease time.Duration, phase float64) skewRun {
	t.Helper()
	const name = "idemskew"
	m := redistest.Start(t)
	r := redistest.StartSkewedReplica(t, m.Addr(), skew)
	sen := redistest.StartSentinelOf(t, name, m.Addr(), r.Port())
	prefix := redistest.Prefix()

	c := newCharges()
	release := make(chan struct{})
	hold := func(r *http.Request) bool {
		if strings.HasPrefix(r.Header.Get(idempotency.HeaderKey), "warm-up") {
			return true
		}
		select {
		case <-release:
			return true
		case <-r.Context().Done():
			return false
		}
	}
	extends := &extendLog{}
	a := sentinelInstance(t, name, []string{sen.Addr()}, prefix, lease, chargeHandler(c, hold),
		func(s idempotency.Store) idempotency.Store { extends.Store = s; return extends })
	b := sentinelInstance(t, name, []string{sen.Addr()}, prefix, lease, chargeHandler(c, nil), nil)
	for _, in := range []*instance{a, b} {
		if w := in.post("warm-up-"+in.url, "w"); w.status != http.StatusCreated {
			t.Fatalf("warm-up: %v", w)
		}
	}
	run := skewRun{skew: skew, lease: lease}
	rkey := prefix + idempotency.StorageKey("", "k")
	watch := watchLease(r.Addr(), rkey)
	aDone := make(chan answer, 1)
	go func() { aDone <- a.post("k", "long job") }()
	run.ops++
	waitUntil(t, 5*time.Second, "A's first heartbeat on the replica", func() bool {
		return len(watch.seen()) >= 2
	})
	holder := watch.seen()[0].token
	time.Sleep(time.Duration(phase * float64(lease/3)))
	if _, err := redistest.Do(sen.Addr(), "SENTINEL", "FAILOVER", name); err != nil {
		t.Fatalf("SENTINEL FAILOVER: %v", err)
	}
	waitUntil(t, 10*time.Second, "the replica's promotion", func() bool {
		info, err := redistest.Do(r.Addr(), "INFO", "replication")
		return err == nil && redistest.InfoField(info, "role") == "master"
	})
	promoted := time.Now()
	run.leftAtSwitch = leaseLeft(t, r.Addr(), rkey)

	var dupAnswers []answer
	for time.Since(promoted) < 2*lease {
		d := b.post("k", "long job")
		run.ops++
		if d.status != http.StatusConflict && d.status != http.StatusServiceUnavailable && d.err == nil {
			dupAnswers = append(dupAnswers, d)
			run.stolen = true
			break
		}
		if _, ok := renewedAfter(watch.seen(), holder, promoted); ok {
			break // from now on the new master judges a lease it wrote
		}
		time.Sleep(50 * time.Millisecond)
	}
	if run.stolen {
		// A's handler goes on until its heartbeat learns of the steal and
		// cancels its context, or a lease passes.
		redistest.WaitFor(lease, func() bool {
			_, _, cancelled := c.of("k")
			return len(cancelled) > 0
		})
	}
	close(release)
	aAns := <-aDone
	changes := watch.end()

	// The gap: from the master's TIME when it wrote the last lease field
	// the replica had before its promotion (the lease's end less its
	// length) to the holder's first heartbeat on the new master (its TIME
	// less the skew; or, once stolen, the send of the first extend the new
	// master refused).
	if last, ok := lastBefore(changes, holder, promoted); ok {
		from := leaseWritten(last.lease, lease)
		if next, ok := renewedAfter(changes, holder, promoted); ok {
			run.gap = leaseWritten(next.lease, lease).Add(-skew).Sub(from)
		} else if lost, ok := extends.firstLost(); ok {
			run.gap = lost.Sub(from)
		}
	}

	done, started, cancelled := c.of("k")
	run.executions = len(started)
	if run.stolen {
		aEnd := time.Now()
		if len(cancelled) > 0 {
			aEnd = cancelled[0]
		}
		if len(started) == 2 && aEnd.After(started[1]) {
			run.overlap = aEnd.Sub(started[1])
		}
	} else {
		if aAns.status != http.StatusCreated || done != 1 || len(started) != 1 {
			t.Errorf("skew %v, no steal: A got %v, %d executions, %d charges; want A's one execution completed", skew, aAns, len(started), done)
		}
		if d := b.retryPast409(t, "k", "long job"); !d.replayed || d.body != aAns.body {
			t.Errorf("skew %v: the duplicate after A completed got %v, want A's replay", skew, d)
		}
		run.ops += 2
	}
	if run.gap <= 0 {
		t.Fatalf("%v: the heartbeat gap could not be measured (lease field changes %v)", run, changes)
	}
	// Duplicates every 50ms, replication and polling blur the line.
	if d := run.skew - (run.lease - run.gap); (d > 300*time.Millisecond || d < -300*time.Millisecond) && run.stolen != run.predicted() {
		t.Errorf("%v: stolen=%v, but lease %v − gap %v − skew %v predicts stolen=%v", run, run.stolen, lease, run.gap, skew, run.predicted())
	}
	t.Logf("%v; A answered %v; duplicates that ran: %v", run, aAns, dupAnswers)
	return run
}

// TestSkewSentinelFailover runs a Sentinel failover to a replica whose clock
// is ahead, while a handler holds a lease of 3s with its heartbeat going, and
// checks each run against the model: a duplicate steals exactly when the
// skew is more than the lease less the heartbeat gap the new master saw
// (the time from the last heartbeat it had as a replica to the holder's
// first one on it). Heartbeats that land on the old master while the
// clients switch are lost to the new one, so with Sentinel the gap was two
// heartbeat intervals (2s). A skew of 0.5s is absorbed: every duplicate gets
// 409 and the holder completes. A skew of 4s, more than the lease, lets the
// first duplicate on the new master steal the record while the holder's
// handler still runs, until the holder's next heartbeat learns of the loss
// and cancels it. With IDEMPOTENCY_TOPOLOGY_LONG=1 it runs skews of 0.5s,
// 1s, 1.5s, 2s, 2.5s and 4s at several phases of the heartbeat and reports
// how many runs were stolen at each.
func TestSkewSentinelFailover(t *testing.T) {
	t.Parallel()
	const lease = 3 * time.Second
	if !topologyLong() {
		for _, tc := range []struct {
			skew  time.Duration
			steal bool
		}{{500 * time.Millisecond, false}, {4 * time.Second, true}} {
			t.Run("skew="+tc.skew.String(), func(t *testing.T) {
				t.Parallel()
				run := runSkewedFailover(t, tc.skew, lease, 0.5)
				if run.stolen != tc.steal && run.predicted() != run.stolen {
					t.Fatalf("%v; want stolen=%v", run, tc.steal)
				}
				if run.stolen && run.overlap <= 0 {
					t.Fatalf("%v: want the duplicate to have run while the holder's handler still ran", run)
				}
				note := "lease 3s, " + run.String()
				if run.stolen {
					note += " (beyond the tolerated skew: documented)"
				}
				reliability.Report(t, reliability.Result{Scenario: "clock skew: Sentinel failover to a skewed replica",
					Store: "redis-sentinel", Operations: int64(run.ops), Faults: 2, Note: note})
			})
		}
		return
	}
	skews := []time.Duration{500 * time.Millisecond, time.Second, 1500 * time.Millisecond, 2 * time.Second,
		2500 * time.Millisecond, 4 * time.Second}
	phases := []float64{0.1, 0.5, 0.9}
	for _, skew := range skews {
		t.Run("skew="+skew.String(), func(t *testing.T) {
			stolen, runs, ops := 0, 0, 0
			var gaps []string
			for _, phase := range phases {
				for i := 0; i < 2; i++ {
					var run skewRun
					t.Run(fmt.Sprintf("phase=%.1f#%d", phase, i), func(t *testing.T) {
						run = runSkewedFailover(t, skew, lease, phase)
					})
					runs++
					ops += run.ops
					if run.stolen {
						stolen++
					}
					gaps = append(gaps, run.gap.Round(10*time.Millisecond).String())
				}
			}
			if skew < lease/10 && stolen > 0 {
				t.Errorf("skew %v under the middleware's guard: %d of %d runs stolen", skew, stolen, runs)
			}
			if skew > lease && stolen != runs {
				t.Errorf("skew %v over the lease: only %d of %d runs stolen", skew, stolen, runs)
			}
			reliability.Report(t, reliability.Result{Scenario: "clock skew: Sentinel failover to a skewed replica (long)",
				Store: "redis-sentinel", Operations: int64(ops), Faults: int64(2 * runs),
				Note: fmt.Sprintf("lease %v, skew %v: %d of %d runs stolen; heartbeat gaps %s", lease, skew, stolen, runs, strings.Join(gaps, " "))})
		})
	}
}
