package sqlitestore_test

import (
	"fmt"
	"net/http"
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
func TestProofKillMidHandler(t *testing.T) {
	const keys, lease = 20, 500 * time.Millisecond
	r := newRig(t)
	env := proofLeaseEnv + "=" + lease.String()
	srv := r.start(env)
	conflicted := 0          // keys whose retry was answered 409 at least once
	var unavailable []string // 503 answers to a retry, with their bodies
	var restarts, stolenAfter time.Duration
	begin := time.Now()
	for i := range keys {
		key := fmt.Sprintf("kill-handler-%02d", i)
		sent := time.Now() // the record's acquire, and its lease, come after
		first := make(chan reply, 1)
		go func() { first <- r.post(srv.url, "/pay", key, hangHeader, "handler") }()
		r.await(srv.Process, "HANDLER", key, 10*time.Second)
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

		var retry reply
		for n := 0; ; n++ {
			retry = r.post(srv.url, "/pay", key)
			// A client retries 409 (in flight) and 503 (the store could not
			// answer: seen on a retry right after a SIGKILL in about one run
			// of six, its cause not yet known, the bodies are logged); both
			// are the retry class, and neither ran the handler: the rows
			// and the epoch below still must show one execution.
			if retry.status == http.StatusServiceUnavailable {
				unavailable = append(unavailable, key+": "+retry.body)
			} else if retry.status != http.StatusConflict {
				break
			}
			if n == 0 && retry.status == http.StatusConflict {
				conflicted++
			}
			if time.Since(sent) > 20*lease {
				t.Fatalf("%s: still in flight %v after the killed attempt was sent", key, time.Since(sent))
			}
			time.Sleep(lease / 10)
		}
		// The store steals only once the lease has run out, and the lease
		// ran from the acquire, after sent.
		if retry.at.Before(sent.Add(lease)) {
			t.Fatalf("%s: answered %v %v after the killed attempt was sent, before its %v lease could have run out", key, retry, retry.at.Sub(sent), lease)
		}
		stolenAfter += retry.at.Sub(sent)
		wantReply(t, key+" retry", retry, http.StatusCreated, "", false)
		if want := fmt.Sprintf("paid %s at epoch 2 by %s,", key, srv.Name); !strings.HasPrefix(retry.body, want) {
			t.Fatalf("%s: the retry answered %q, want %q...", key, retry.body, want)
		}
		dup := r.post(srv.url, "/pay", key)
		wantReply(t, key+" duplicate", dup, http.StatusCreated, "", true)
		if dup.body != retry.body {
			t.Fatalf("%s: replay %q, stored %q", key, dup.body, retry.body)
		}
		if got, want := r.effects(key), []string{"2 " + srv.Name}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: effect rows %v, want %v (the thief's only)", key, got, want)
		}
		if st, epoch := r.record(key); st != "complete" || epoch != 2 {
			t.Fatalf("%s: record %q at epoch %d, want complete at 2", key, st, epoch)
		}
	}
	srv.Stop(5 * time.Second)
	rows, complete := r.count(`SELECT count(*) FROM effects`), r.count(`SELECT count(*) FROM `+sqlitestore.DefaultTable+` WHERE state = 'complete'`)
	t.Logf("%d keys, %d servers SIGKILLed mid-handler and restarted on the file (restart %v on average): %d effect rows, %d records complete; %d of %d retries answered 409 in flight first, each stole %v after its first attempt on average (lease %v); %v in all",
		keys, keys, (restarts / keys).Round(time.Millisecond), rows, complete, conflicted, keys, (stolenAfter / keys).Round(time.Millisecond), lease, time.Since(begin).Round(time.Millisecond))
	if len(unavailable) > 0 {
		t.Logf("%d retries answered 503 and were sent again: %q", len(unavailable), unavailable)
	}
	if rows != keys || complete != keys {
		t.Fatalf("%d effect rows and %d complete records for %d keys", rows, complete, keys)
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
