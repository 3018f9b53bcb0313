package sqlitestore_test

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/sqlitestore"
)

// TestProofTwoProcessesOneFile: two server processes share one file
// (WithPollInterval, so that a waiter in one is woken when the other
// completes). Every one of 1,000 keys is sent three times at once, each
// copy to one of the two at random, on a route in wait mode, and sent
// again on a 409 until answered. At the end the handlers ran once per
// key: 1,000 effect rows, one per key; every key got exactly one reply
// from an execution, and its duplicates replayed that reply's body.
func TestProofTwoProcessesOneFile(t *testing.T) {
	const keys, copies, clients = 1000, 3, 16
	r := newRig(t)
	env := proofPollEnv + "=20ms"
	servers := [2]*proc{r.start(env), r.start(env)}

	answers := make([][copies]reply, keys)
	sentTo := make([][copies]int, keys)
	var retried409 atomic.Int64
	work := make(chan int)
	var wg sync.WaitGroup
	begin := time.Now()
	for range clients {
		wg.Go(func() {
			for i := range work {
				key := fmt.Sprintf("shared-%04d", i)
				var dups sync.WaitGroup
				for c := range copies {
					to := rand.IntN(len(servers))
					sentTo[i][c] = to
					dups.Go(func() {
						deadline := time.Now().Add(30 * time.Second)
						for {
							a := r.post(servers[to].url, "/wait", key)
							answers[i][c] = a
							if a.status != http.StatusConflict || time.Now().After(deadline) {
								return
							}
							retried409.Add(1)
							time.Sleep(20 * time.Millisecond)
						}
					})
				}
				dups.Wait()
			}
		})
	}
	for i := range keys {
		work <- i
	}
	close(work)
	wg.Wait()
	took := time.Since(begin)
	for _, s := range servers {
		s.Stop(5 * time.Second)
	}

	executions, replays, split := 0, 0, 0
	byServer := map[string]int{}
	for i := range keys {
		key := fmt.Sprintf("shared-%04d", i)
		first := ""
		for c, a := range answers[i] {
			if a.err != nil || a.status != http.StatusCreated {
				t.Errorf("%s, copy %d: %v", key, c, a)
				continue
			}
			if a.replayed {
				replays++
				continue
			}
			executions++
			if first != "" {
				t.Errorf("%s executed twice: %q and %q", key, first, a.body)
			}
			first = a.body
			for _, s := range servers {
				if strings.Contains(a.body, " by "+s.Name+",") {
					byServer[s.Name]++
				}
			}
		}
		for c, a := range answers[i] {
			if a.status == http.StatusCreated && a.body != first {
				t.Errorf("%s, copy %d: answered %q, the execution %q", key, c, a.body, first)
			}
		}
		if sentTo[i][0] != sentTo[i][1] || sentTo[i][0] != sentTo[i][2] {
			split++
		}
	}
	rows := r.count(`SELECT count(*) FROM effects`)
	distinct := r.count(`SELECT count(DISTINCT idem_key) FROM effects`)
	complete := r.count(`SELECT count(*) FROM ` + sqlitestore.DefaultTable + ` WHERE state = 'complete'`)
	t.Logf("%d keys sent %d times at once to two processes on one file (%d keys split across both): %d effect rows of %d keys, %d records complete; answers: %d executions (%v), %d replays, %d 409s sent again; %v",
		keys, copies, split, rows, distinct, complete, executions, byServer, replays, retried409.Load(), took.Round(time.Millisecond))
	if rows != keys || distinct != keys || executions != keys || complete != keys || replays != keys*(copies-1) {
		t.Fatalf("%d effect rows of %d keys, %d executions, %d replays, %d complete records; want %d, %d, %d, %d, %d",
			rows, distinct, executions, replays, complete, keys, keys, keys, keys*(copies-1), keys)
	}
}
