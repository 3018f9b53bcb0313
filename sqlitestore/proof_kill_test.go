package sqlitestore_test

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/sqlitestore"
)

// TestProofKillMidHandler: a server is killed with SIGKILL while its
// handler runs, its effect row written in the request's open transaction,
// and a new server is started on the same file. The client's retry with
// the same key finds the killed attempt's record in flight (409) until
// its lease runs out, then steals it and runs the handler, which writes
// the one effect row that stands; a duplicate replays its answer. Each
// restarted server takes the next key's request and is killed in turn,
// for every key. At the end the file holds one effect row per key, the
// thief's.
//
// A client also retries a 503. On a loaded machine an acquire can take
// more than half of the proof's short lease (a durable commit waits for
// the disk): the middleware then releases the record unused and answers
// 503 store_unavailable ("answered too slowly"), and the server's event
// says how long the acquire took, which the proof logs. A released steal
// leaves no record, so the retry after it acquires the key afresh, at
// epoch 1: the rows must still show one execution, the answer's. So that
// every run shows it, the proof makes one first attempt (slowFirst) and
// one steal (slowSteal) slow: the parent holds the file's write lock for
// most of a lease meanwhile, as a writer whose commit waits for the disk
// would.
func TestProofKillMidHandler(t *testing.T) {
	const keys, lease = 20, 500 * time.Millisecond
	const slowFirst, slowSteal = 5, 3 // the keys whose acquire is made slow
	r := newRig(t)
	env := proofLeaseEnv + "=" + lease.String()
	srv := r.start(env)
	conflicted := 0          // keys whose retry was answered 409 at least once
	var unavailable []string // the servers' events of the 503 answers
	unavailableFrom := func(p *proc, key, what string, a reply) {
		event := r.awaitEvent(p.Process, 5*time.Second, " 503 ")
		t.Logf("%s: %s answered 503 %q; %s's event: %s", key, what, a.code, p.Name, event)
		unavailable = append(unavailable, key+" ("+what+"): "+event)
	}
	var restarts, stolenAfter time.Duration
	begin := time.Now()
	for i := range keys {
		key := fmt.Sprintf("kill-handler-%02d", i)
		var sent time.Time // the record's acquire, and its lease, come after
		first := make(chan reply, 1)
		for n := 0; ; n++ {
			if i == slowFirst && n == 0 {
				r.holdWriteLock(lease * 4 / 5)
			}
			sent = time.Now()
			go func() { first <- r.post(srv.url, "/pay", key, hangHeader, "handler") }()
			_, a, ran := r.awaitOrReply(srv.Process, "HANDLER", "text "+key, func(got string) bool { return got == key }, 10*time.Second, first)
			if ran {
				break
			}
			if a.status != http.StatusServiceUnavailable {
				t.Fatalf("%s: the first attempt was answered %v before its handler ran", key, a)
			}
			unavailableFrom(srv, key, "the first attempt", a)
		}
		if got := r.effects(key); len(got) != 0 {
			t.Fatalf("%s: effect rows %v visible before the commit", key, got)
		}
		srv.Kill()
		if a := <-first; a.err == nil {
			t.Fatalf("%s: the killed server answered %v", key, a)
		}
		if st, epoch := r.record(key); st != "in_progress" || epoch != 1 {
			t.Fatalf("%s: the killed attempt's record is %q at epoch %d, want in_progress at 1", key, st, epoch)
		}
		killed := time.Now()
		srv = r.start(env)
		restarts += time.Since(killed)

		if i == slowSteal {
			// The first retry steals once the lease has run out, while
			// the lock is held.
			time.Sleep(time.Until(r.leaseEnd(key)) + 10*time.Millisecond)
			r.holdWriteLock(lease * 4 / 5)
		}
		var retry reply
		sawConflict, sawUnavailable := false, false
		for n := 0; ; n++ {
			retry = r.post(srv.url, "/pay", key)
			// A client retries 409 (in flight) and 503; neither ran the
			// handler.
			if retry.status == http.StatusServiceUnavailable {
				sawUnavailable = true
				unavailableFrom(srv, key, fmt.Sprintf("retry %d", n), retry)
			} else if retry.status != http.StatusConflict {
				break
			} else {
				sawConflict = true
			}
			if time.Since(sent) > 20*lease {
				t.Fatalf("%s: still in flight %v after the killed attempt was sent", key, time.Since(sent))
			}
			time.Sleep(lease / 10)
		}
		if sawConflict {
			conflicted++
		}
		// The store steals only once the lease has run out, and the lease
		// ran from the acquire, after sent.
		if retry.at.Before(sent.Add(lease)) {
			t.Fatalf("%s: answered %v %v after the killed attempt was sent, before its %v lease could have run out", key, retry, retry.at.Sub(sent), lease)
		}
		stolenAfter += retry.at.Sub(sent)
		wantReply(t, key+" retry", retry, http.StatusCreated, "", false)
		// The thief's epoch is 2; after a 503 that released a steal, the
		// key was acquired afresh.
		var epoch int64
		if _, err := fmt.Sscanf(retry.body, "paid "+key+" at epoch %d by "+srv.Name+",", &epoch); err != nil || (epoch != 2 && !sawUnavailable) {
			t.Fatalf("%s: the retry answered %q, want \"paid %s at epoch 2 by %s,...\"", key, retry.body, key, srv.Name)
		}
		dup := r.post(srv.url, "/pay", key)
		wantReply(t, key+" duplicate", dup, http.StatusCreated, "", true)
		if dup.body != retry.body {
			t.Fatalf("%s: replay %q, stored %q", key, dup.body, retry.body)
		}
		if got, want := r.effects(key), []string{fmt.Sprintf("%d %s", epoch, srv.Name)}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: effect rows %v, want %v (the answer's only)", key, got, want)
		}
		if st, e := r.record(key); st != "complete" || e != epoch {
			t.Fatalf("%s: record %q at epoch %d, want complete at %d", key, st, e, epoch)
		}
	}
	srv.Stop(5 * time.Second)
	rows, complete := r.count(`SELECT count(*) FROM effects`), r.count(`SELECT count(*) FROM `+sqlitestore.DefaultTable+` WHERE state = 'complete'`)
	t.Logf("%d keys, %d servers SIGKILLed mid-handler and restarted on the file (restart %v on average): %d effect rows, %d records complete; %d of %d retries found the killed attempt in flight (409), each key answered %v after its first attempt on average (lease %v); %v in all",
		keys, keys, (restarts / keys).Round(time.Millisecond), rows, complete, conflicted, keys, (stolenAfter / keys).Round(time.Millisecond), lease, time.Since(begin).Round(time.Millisecond))
	if len(unavailable) > 0 {
		t.Logf("%d answers 503, sent again: %q", len(unavailable), unavailable)
	}
	if rows != keys || complete != keys {
		t.Fatalf("%d effect rows and %d complete records for %d keys", rows, complete, keys)
	}
	for _, i := range []int{slowFirst, slowSteal} {
		key := fmt.Sprintf("kill-handler-%02d", i)
		if !slices.ContainsFunc(unavailable, func(u string) bool { return strings.HasPrefix(u, key+" ") }) {
			t.Errorf("%s: its slow acquire was not answered 503 (the 503s: %q)", key, unavailable)
		}
	}
	// A restart slower than the lease would skip the in-flight answer:
	// then the proof has not shown it.
	if conflicted < keys/2 {
		t.Fatalf("only %d of %d retries found the killed attempt in flight (restart %v on average, lease %v)", conflicted, keys, restarts/keys, lease)
	}
}

// TestProofKillAfterCommit: a server is killed with SIGKILL after the
// record and the handler's effect row committed, before the response's
// first byte reached the client (the parent sees the record COMPLETE and
// the row in the file, then kills). A new server on the same file
// answers the client's retry with the stored response
// (Idempotent-Replayed: true), the killed server's, and the file holds
// one effect row: the commit is the execution, whether or not its reply
// got out.
func TestProofKillAfterCommit(t *testing.T) {
	const keys = 10
	r := newRig(t)
	srv := r.start()
	begin := time.Now()
	for i := range keys {
		key := fmt.Sprintf("kill-reply-%02d", i)
		first := make(chan reply, 1)
		go func() { first <- r.post(srv.url, "/pay", key, hangHeader, "reply") }()
		r.await(srv.Process, "COMMITTED", key, 10*time.Second)
		if st, _ := r.record(key); st != "complete" {
			t.Fatalf("%s: the record is %q before the reply, want complete", key, st)
		}
		if got := r.effects(key); len(got) != 1 {
			t.Fatalf("%s: effect rows %v before the reply, want 1", key, got)
		}
		select {
		case a := <-first:
			t.Fatalf("%s: the client was answered before the kill: %v", key, a)
		default:
		}
		killed := srv.Name
		srv.Kill()
		if a := <-first; a.err == nil {
			t.Fatalf("%s: the killed server answered %v", key, a)
		}
		srv = r.start()
		retry := r.post(srv.url, "/pay", key)
		wantReply(t, key+" retry", retry, http.StatusCreated, "", true)
		if want := fmt.Sprintf("paid %s at epoch 1 by %s,", key, killed); !strings.HasPrefix(retry.body, want) {
			t.Fatalf("%s: the retry replayed %q, want the killed server's %q...", key, retry.body, want)
		}
		if got, want := r.effects(key), []string{"1 " + killed}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: effect rows %v, want %v", key, got, want)
		}
	}
	srv.Stop(5 * time.Second)
	rows, complete := r.count(`SELECT count(*) FROM effects`), r.count(`SELECT count(*) FROM `+sqlitestore.DefaultTable+` WHERE state = 'complete'`)
	t.Logf("%d keys, %d servers SIGKILLed between the commit and the reply and restarted on the file: %d effect rows, %d records complete, %d retries replayed; %v in all",
		keys, keys, rows, complete, keys, time.Since(begin).Round(time.Millisecond))
	if rows != keys || complete != keys {
		t.Fatalf("%d effect rows and %d complete records for %d keys", rows, complete, keys)
	}
}
