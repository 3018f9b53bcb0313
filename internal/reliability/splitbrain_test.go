package reliability_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/faultproxy"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/redisstore"
)

// The split-brain scenarios cut an old master off from its Sentinel and its
// replica, but not from one application instance. The replica replicates,
// and the sentinel monitors, the master through one fault proxy; instance A
// talks to the master directly; instance B uses a Sentinel-aware client.
// Stalling the proxy (a silent partition: connections stay open, nothing
// passes) or cutting it (connections closed, new ones refused) partitions
// the master from the sentinel and the replica only. The sentinel promotes
// the replica; A goes on writing to the old master, B to the new one; on
// heal the old master becomes a replica of the new one (the sentinel does it
// about 10s after it sees the old master again; the short runs send the same
// REPLICAOF at once), and what was written to it during the partition is
// gone.

// sides records which instance executed each key, in order.
type sides struct {
	mu  sync.Mutex
	ran map[string][]string
}

func newSides() *sides { return &sides{ran: map[string][]string{}} }

// handler answers 201 with a body naming the key, the side and the
// execution's number for that key.
func (s *sides) handler(side string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(idempotency.HeaderKey)
		io.Copy(io.Discard, r.Body)
		s.mu.Lock()
		s.ran[key] = append(s.ran[key], side)
		n := len(s.ran[key])
		s.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "key=%s side=%s n=%d", key, side, n)
	})
}

func (s *sides) of(key string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.ran[key]...)
}

// shortfalls records what a store's WAIT reported, by storage key.
type shortfalls struct {
	mu     sync.Mutex
	keys   map[string]bool
	acked0 int // WAIT answered that no replica acknowledged the write
	failed int // WAIT itself failed
}

func (s *shortfalls) add(key string, err *redisstore.WAITError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys == nil {
		s.keys = map[string]bool{}
	}
	s.keys[key] = true
	switch {
	case err.Err != nil:
		s.failed++
	case err.Acked == 0:
		s.acked0++
	}
}

func (s *shortfalls) has(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.keys[key]
}

func (s *shortfalls) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("%d shortfalls: %d with no replica acknowledging, %d WAIT failures", len(s.keys), s.acked0, s.failed)
}

// waitInstance is an application instance over c whose store waits for one
// replica after each complete (WithWAIT(1, 100ms)) and records every
// completion that no replica acknowledged in short.
func waitInstance(t *testing.T, c redis.UniversalClient, prefix string, h http.Handler, short *shortfalls) *instance {
	t.Helper()
	store := redisstore.New(c, redisstore.WithPrefix(prefix),
		redisstore.WithWAIT(1, 100*time.Millisecond),
		redisstore.WithWAITErrorHandler(func(_ context.Context, err *redisstore.WAITError) {
			short.add(strings.TrimPrefix(err.Key, prefix), err)
		}))
	t.Cleanup(func() { store.Close() })
	in := &instance{ev: &events{}}
	srv, client := serve(t, idempotency.New(store, idempotency.WithLease(time.Second), idempotency.WithObserver(in.ev.observe))(h))
	in.url, in.client = srv.URL+"/pay", client
	return in
}

// sent is one request and its answer.
type sent struct {
	key string
	at  time.Time
	ans answer
}

// fresh reports whether the answer is a new execution's response.
func (s sent) fresh() bool {
	return s.ans.err == nil && s.ans.status == http.StatusCreated && !s.ans.replayed
}

// splitBrainCase says how one split-brain run is set up.
type splitBrainCase struct {
	name string
	// silent partitions with a stall (connections stay open, nothing
	// passes), else with a cut (connections closed, new ones refused).
	silent bool
	// masterArgs and replicaArgs configure the old master and the replica
	// (the new master after the failover).
	masterArgs, replicaArgs []string
	// sentinelHeal waits on heal for the sentinel to make the old master
	// a replica of the new one; else the test sends it the REPLICAOF the
	// sentinel would, as soon as the partition ends.
	sentinelHeal bool
	// crossFor is how long both sides take requests after the failover.
	crossFor time.Duration
}

// splitBrainRun is what one split-brain run counted.
type splitBrainRun struct {
	ops               int
	aSent, aExecuted  int           // A's requests during the partition, and those it executed
	a503              int           // A's requests answered 503 store_unavailable
	lastAExecution    time.Duration // from the partition to A's last execution
	crossed           int           // keys executed on one side whose duplicate went to the other
	double            int           // keys executed on both sides
	bThenA            int           // of those, keys B executed first and A again
	lost              int           // A's completions that did not survive the heal
	lostReported      int           // of those, the ones reported: by A's WAIT, or as a failed complete
	shortfalls        int           // A's completions during the partition that A's WAIT reported
	completeFailed    int           // A's executions whose complete the old master refused
	b503              int           // B's requests to the new master answered 503 store_unavailable
	bResumed          time.Duration // for a new master refusing writes: from the heal to B's first write
	failover, healing time.Duration // partition to promotion; heal to the old master replicating
	aWAIT, bWAIT      string        // what each side's WAIT reported
}

func (r splitBrainRun) String() string {
	s := fmt.Sprintf("A: %d requests, %d executed (the last %v into the partition), %d answered 503; "+
		"%d keys crossed sides, %d ran on both (%d B first); %d of A's completions lost on heal, %d of them reported "+
		"(%d WAIT shortfalls, %d completes refused); "+
		"promotion %v after the partition, old master replicating %v after the heal; A's WAIT: %s; B's WAIT: %s",
		r.aSent, r.aExecuted, r.lastAExecution.Round(10*time.Millisecond), r.a503, r.crossed, r.double, r.bThenA,
		r.lost, r.lostReported, r.shortfalls, r.completeFailed, r.failover.Round(100*time.Millisecond), r.healing.Round(100*time.Millisecond), r.aWAIT, r.bWAIT)
	if r.b503 > 0 {
		s += fmt.Sprintf("; new master: %d requests answered 503, writes resumed %v after the heal", r.b503, r.bResumed.Round(100*time.Millisecond))
	}
	return s
}

// note is the run's figures in short, for the reliability table.
func (r splitBrainRun) note() string {
	s := fmt.Sprintf("A executed %d keys on the old master, the last %v into the partition, and got %d 503s; "+
		"%d of %d keys sent to both sides ran on both; %d of A's completions lost on heal, %d of them reported "+
		"(%d by WAIT, %d as a refused complete)",
		r.aExecuted, r.lastAExecution.Round(100*time.Millisecond), r.a503, r.double, r.crossed,
		r.lost, r.lostReported, r.shortfalls, r.completeFailed)
	if r.b503 > 0 {
		s += fmt.Sprintf("; the promoted master refused %d requests (503) until the old one rejoined as its replica", r.b503)
	}
	return s
}

// runSplitBrain runs one partition as sc says.
func runSplitBrain(t *testing.T, sc splitBrainCase) splitBrainRun {
	t.Helper()
	const name = "idemsplit"
	m := redistest.Start(t, sc.masterArgs...)
	p, err := faultproxy.New(m.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	_, pport, _ := net.SplitHostPort(p.Addr())
	r := redistest.Start(t, append([]string{"--replicaof", "127.0.0.1", pport}, sc.replicaArgs...)...)
	waitUntil(t, 10*time.Second, "the replica's link through the proxy", func() bool {
		info, err := redistest.Do(r.Addr(), "INFO", "replication")
		return err == nil && redistest.InfoField(info, "master_link_status") == "up"
	})
	// The sentinel reaches the master through the proxy as well; it learns
	// the replica's own address from the master's INFO.
	sen := redistest.StartSentinelOf(t, name, p.Addr(), r.Port())

	prefix := redistest.Prefix()
	log := newSides()
	var aShort, bShort shortfalls
	a := waitInstance(t, fastClient(t, m.Addr()), prefix, log.handler("A"), &aShort)
	bc := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    name,
		SentinelAddrs: []string{sen.Addr()},
		DialTimeout:   200 * time.Millisecond,
		ReadTimeout:   300 * time.Millisecond,
		WriteTimeout:  300 * time.Millisecond,
		PoolTimeout:   300 * time.Millisecond,
		MaxRetries:    1,
	})
	t.Cleanup(func() { bc.Close() })
	b := waitInstance(t, bc, prefix, log.handler("B"), &bShort)
	for _, in := range []*instance{a, b} {
		if w := in.post("warm-up-"+in.url, "w"); w.status != http.StatusCreated {
			t.Fatalf("warm-up: %v", w)
		}
	}

	var run splitBrainRun
	partitioned := time.Now()
	if sc.silent {
		p.Stall()
	} else {
		p.Cut()
	}

	// A sends a new key every 20ms for the whole partition.
	var mu sync.Mutex
	var aReqs []sent
	stopA := make(chan struct{})
	aStopped := make(chan struct{})
	go func() {
		defer close(aStopped)
		for i := 0; ; i++ {
			select {
			case <-stopA:
				return
			case <-time.After(20 * time.Millisecond):
			}
			key := "a-" + strconv.Itoa(i)
			s := sent{key: key, at: time.Now()}
			s.ans = a.post(key, "pay")
			mu.Lock()
			aReqs = append(aReqs, s)
			mu.Unlock()
		}
	}()

	waitUntil(t, 30*time.Second, "the sentinel to promote the replica", func() bool {
		addr, err := redistest.Do(sen.Addr(), "SENTINEL", "GET-MASTER-ADDR-BY-NAME", name)
		return err == nil && strings.Replace(addr, "\n", ":", 1) == r.Addr()
	})
	run.failover = time.Since(partitioned)
	bWrites := redistest.WaitFor(3*time.Second, func() bool {
		run.ops++
		ans := b.post("b-probe", "pay")
		if ans.status == http.StatusServiceUnavailable && ans.code == string(idempotency.CodeStoreUnavailable) {
			run.b503++
		}
		return ans.status == http.StatusCreated
	})

	// Both sides take requests; each key executed on one side is sent
	// again to the other, as a client's retry through a load balancer is.
	var crossed []sent
	done := 0 // A's requests already crossed to B
	cross := func(s sent) {
		if s.fresh() {
			crossed = append(crossed, sent{key: s.key, at: time.Now(), ans: b.post(s.key, "pay")})
			run.ops++
		}
	}
	for i, start := 0, time.Now(); bWrites && time.Since(start) < sc.crossFor; i++ {
		key := "b-" + strconv.Itoa(i)
		first := sent{key: key, at: time.Now(), ans: b.post(key, "pay")}
		run.ops++
		if first.fresh() {
			crossed = append(crossed, sent{key: key, at: time.Now(), ans: a.post(key, "pay")})
			run.ops++
		}
		mu.Lock()
		pending := aReqs[done:]
		done = len(aReqs)
		mu.Unlock()
		for _, s := range pending {
			cross(s)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !bWrites {
		time.Sleep(sc.crossFor) // A goes on alone
	}
	close(stopA)
	<-aStopped
	// A record completed before the partition still replays on the old
	// master, refusing writes or not: a replay only reads.
	if w := a.post("warm-up-"+a.url, "w"); !w.replayed {
		t.Errorf("A's replay of a record completed before the partition: %v", w)
	}
	run.ops++
	if bWrites {
		for _, s := range aReqs[done:] { // A's last requests cross too
			cross(s)
		}
	}

	// Heal: the old master becomes a replica of the new one, which
	// replaces its data.
	healed := time.Now()
	p.Restore()
	if !sc.sentinelHeal {
		if _, err := redistest.Do(m.Addr(), "REPLICAOF", "127.0.0.1", strconv.Itoa(r.Port())); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, 60*time.Second, "the old master to replicate the new one", func() bool {
		info, err := redistest.Do(m.Addr(), "INFO", "replication")
		return err == nil && redistest.InfoField(info, "role") == "slave" &&
			redistest.InfoField(info, "master_port") == strconv.Itoa(r.Port()) &&
			redistest.InfoField(info, "master_link_status") == "up"
	})
	run.healing = time.Since(healed)
	if !bWrites {
		waitUntil(t, 30*time.Second, "B to write to the new master once it has a replica", func() bool {
			run.ops++
			return b.post("b-probe", "pay").status == http.StatusCreated
		})
		run.bResumed = time.Since(healed)
	}

	// A completion the old master refused (a complete is refused whole
	// once min-replicas-to-write is not met) is reported as a store error:
	// the outcome of a request whose handler ran.
	aFailed := map[string]bool{}
	a.ev.mu.Lock()
	for _, e := range a.ev.all {
		if e.Kind == idempotency.EventStoreError && e.Final && e.Ran {
			aFailed[e.Key] = true
		}
	}
	a.ev.mu.Unlock()

	// After the heal every key A executed is sent once more, to B.
	run.aSent = len(aReqs)
	for _, s := range aReqs {
		run.ops++
		switch {
		case s.fresh():
			run.aExecuted++
			run.lastAExecution = s.at.Sub(partitioned)
			sk := idempotency.StorageKey("", s.key)
			switch {
			case aShort.has(sk):
				run.shortfalls++
			case aFailed[sk]:
				run.completeFailed++
			}
			after := b.retryPast409(t, s.key, "pay")
			run.ops++
			if !after.replayed || after.body != s.ans.body {
				run.lost++
				if aShort.has(sk) || aFailed[sk] {
					run.lostReported++
				}
			}
		case s.ans.status == http.StatusServiceUnavailable && s.ans.code == string(idempotency.CodeStoreUnavailable):
			run.a503++
		}
	}
	run.crossed = len(crossed)
	for _, c := range crossed {
		if ran := log.of(c.key); len(ran) >= 2 && ran[0] != ran[1] {
			run.double++
			if ran[0] == "B" {
				run.bThenA++
			}
		}
	}
	run.aWAIT, run.bWAIT = aShort.String(), bShort.String()
	t.Logf("split brain %s: %v", sc.name, run)
	return run
}

// TestSplitBrain cuts the master off from its sentinel and its replica,
// silently (connections stay open, nothing passes), while instance A still
// talks to it. The sentinel promotes the replica; A keeps executing on the
// old master and B on the new one; each key is then sent to the other side
// too, and after the heal once more to the surviving master.
//
// Without min-replicas-to-write every key A executed during the partition
// ran on both sides when crossed, and every one of A's completions is lost on
// heal; WAIT (WithWAIT(1, 100ms)) reported each of them. With
// min-replicas-to-write 1 and min-replicas-max-lag 1 on the master, it
// refuses writes once its replica has been silent for more than the lag,
// which it checks once a second: A gets 503 from then on, and only requests
// in that first window (about 1.5s; at most about 3s) can run twice or be
// lost, each reported by WAIT or, when the master refused the complete
// itself, as a store error.
//
// With IDEMPOTENCY_TOPOLOGY_LONG=1 the heal waits for the sentinel itself,
// and more cases run: a closed partition (connections cut), and
// min-replicas-to-write set on the replica too, which leaves the promoted
// master, alone, refusing writes until the old one rejoins as its replica.
func TestSplitBrain(t *testing.T) {
	t.Parallel()
	minReplicas := []string{"--min-replicas-to-write", "1", "--min-replicas-max-lag", "1"}
	cases := []splitBrainCase{
		{name: "silent", silent: true},
		{name: "silent, min-replicas-to-write 1", silent: true, masterArgs: minReplicas},
	}
	if topologyLong() {
		cases = append(cases,
			splitBrainCase{name: "closed", silent: false},
			splitBrainCase{name: "closed, min-replicas-to-write 1", silent: false, masterArgs: minReplicas},
			splitBrainCase{name: "silent, min-replicas-to-write 1 on both", silent: true, masterArgs: minReplicas, replicaArgs: minReplicas})
	}
	for _, sc := range cases {
		sc.sentinelHeal = topologyLong()
		sc.crossFor = 1500 * time.Millisecond
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			run := runSplitBrain(t, sc)
			if run.lost != run.lostReported {
				t.Errorf("%d of A's completions lost, only %d reported by WAIT or as a failed complete", run.lost, run.lostReported)
			}
			if run.shortfalls+run.completeFailed != run.aExecuted {
				t.Errorf("WAIT reported %d of A's %d completions during the partition and %d completes failed, want all reported", run.shortfalls, run.aExecuted, run.completeFailed)
			}
			if run.lost != run.aExecuted {
				t.Errorf("%d of A's %d completions during the partition survived the heal, want none", run.aExecuted-run.lost, run.aExecuted)
			}
			if sc.masterArgs == nil {
				if run.aExecuted < 10 || run.crossed < 10 {
					t.Fatalf("too little traffic: %v", run)
				}
				if run.double != run.crossed {
					t.Errorf("want every crossed key to run on both sides: %v", run)
				}
			} else {
				// The master counts a replica as gone once it has not
				// acknowledged for more than min-replicas-max-lag, which
				// it checks once a second.
				if run.lastAExecution > 4*time.Second {
					t.Errorf("A executed a request %v into the partition: the old master kept taking writes", run.lastAExecution)
				}
				if run.a503 < 10 {
					t.Errorf("want A's requests refused with 503 store_unavailable: %v", run)
				}
				if run.bThenA != 0 {
					t.Errorf("%d keys B executed ran again on the old master, which should refuse writes: %v", run.bThenA, run)
				}
			}
			if sc.replicaArgs != nil && (run.b503 == 0 || run.crossed != 0) {
				t.Errorf("want the promoted master, without a replica, to refuse writes: %v", run)
			}
			note := run.note()
			if sc.masterArgs == nil {
				note += " (documented)"
			}
			reliability.Report(t, reliability.Result{Scenario: "split brain: old master cut off from Sentinel and replica (" + sc.name + ")",
				Store: "redis-sentinel", Operations: int64(run.ops), Faults: 2, Note: note})
		})
	}
}
