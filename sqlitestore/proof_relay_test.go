package sqlitestore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/childproc"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/relay"
	"github.com/go-idempotency/idempotency/sqlitestore"
)

// The relay's proof on a real file: relays that publish the outbox of one
// SQLite file are child processes, this test binary running
// TestProofRelayProcess (Store.Relay on the file), whose sink prints each
// envelope it publishes to its parent before it returns: the broker. The
// parent kills one with SIGKILL while its sink holds a published batch,
// unmarked, and reads the file itself, with a Store of its own.

// Environment of a relay process of the proofs (besides proofFileEnv).
const (
	proofRelayEnv     = "SQLITESTORE_PROOF_RELAY"      // the relay's name; set, the process is a relay
	proofRelayHoldEnv = "SQLITESTORE_PROOF_RELAY_HOLD" // the sink's call that holds once published; default none
)

// The relay processes' settings: a short claim lease, so that a killed
// relay's claims run out within the proof, and small batches, so that its
// pipeline holds several.
const (
	proofRelayLease = time.Second
	proofRelayBatch = 5
)

// TestProofRelayProcess is a relay process of the proofs, started by
// them (run by itself it is skipped). It runs the Store's relay on the
// file the environment names until SIGTERM, through a BatchSink that
// reports PUBLISHED "call id attempt unix-microseconds" for each envelope
// of its calls (numbered from 1), as it publishes it; the call numbered
// by proofRelayHoldEnv then reports HELD and never returns, its envelopes
// published and not yet marked.
func TestProofRelayProcess(t *testing.T) {
	name := os.Getenv(proofRelayEnv)
	if name == "" {
		t.Skip("a relay process of the proofs, started by them")
	}
	childproc.WatchLifeline()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	hold := 0
	if v := os.Getenv(proofRelayHoldEnv); v != "" {
		var err error
		if hold, err = strconv.Atoi(v); err != nil {
			t.Fatal(err)
		}
	}
	store, err := sqlitestore.Open(os.Getenv(proofFileEnv))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	sink := &reportSink{out: &childproc.Reporter{Prefix: proofLinePrefix}, hold: hold}
	r := store.Relay(sink, relay.WithName(name), relay.WithClaimLease(proofRelayLease), relay.WithBatchSize(proofRelayBatch),
		relay.WithPollInterval(50*time.Millisecond))
	if err := r.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

// reportSink is the relay process's BatchSink: it publishes an envelope by
// printing it.
type reportSink struct {
	out  *childproc.Reporter
	hold int // the call that holds once published; 0 for none

	mu    sync.Mutex
	calls int
}

func (p *reportSink) Publish(ctx context.Context, e outbox.Envelope) error {
	return p.PublishBatch(ctx, []outbox.Envelope{e})[0]
}

func (p *reportSink) PublishBatch(_ context.Context, es []outbox.Envelope) []error {
	p.mu.Lock()
	p.calls++
	call := p.calls
	p.mu.Unlock()
	for _, e := range es {
		p.out.Report("PUBLISHED", "%d %s %d %d", call, e.ID, e.Attempt, time.Now().UnixMicro())
	}
	if call == p.hold {
		p.out.Report("HELD", "%d", call)
		select {} // published, not marked: killed here
	}
	return make([]error, len(es))
}

// publication is a PUBLISHED line of a relay process.
type publication struct {
	call    int
	id      string
	attempt int
	at      time.Time
}

// publications takes the PUBLISHED lines of p that r holds, in the order
// p printed them.
func (r *rig) publications(p *childproc.Process) []publication {
	r.t.Helper()
	r.pending = append(r.pending, r.lines.Take()...)
	var got []publication
	r.pending = slices.DeleteFunc(r.pending, func(l childproc.Line) bool {
		if l.From != p || l.Kind != "PUBLISHED" {
			return false
		}
		var x publication
		var at int64
		if _, err := fmt.Sscanf(l.Text, "%d %s %d %d", &x.call, &x.id, &x.attempt, &at); err != nil {
			r.t.Fatalf("%s's line %q: %v", p.Name, l.Text, err)
		}
		x.at = time.UnixMicro(at)
		got = append(got, x)
		return true
	})
	return got
}

// outboxRow is a message's row in the proof's file.
type outboxRow struct {
	rowID      int64
	status     string
	attempts   int
	claimedBy  string
	claimUntil time.Time // the zero time when not claimed
	key        string    // the ordering key
}

// outboxRows reads every message of the file, by ID.
func (r *rig) outboxRows() map[string]outboxRow {
	r.t.Helper()
	rows, err := r.store.DB().Query(`SELECT storage_key || '/' || seq, id, status, attempts, coalesce(claimed_by, ''),
		coalesce(claim_until, 0), ordering_key FROM ` + sqlitestore.DefaultOutboxTable)
	if err != nil {
		r.t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]outboxRow{}
	for rows.Next() {
		var id string
		var x outboxRow
		var until int64
		if err := rows.Scan(&id, &x.rowID, &x.status, &x.attempts, &x.claimedBy, &until, &x.key); err != nil {
			r.t.Fatal(err)
		}
		if until != 0 {
			x.claimUntil = time.UnixMicro(until)
		}
		got[id] = x
	}
	if err := rows.Err(); err != nil {
		r.t.Fatal(err)
	}
	return got
}

// TestProofRelayKilledBetweenPublishAndMark: a relay process publishing
// the outbox of a file (batches of 5, claim lease 1s) is killed with
// SIGKILL while its sink holds its third batch, published and not marked:
// the first batch is marked, the second marked or its mark on its way,
// the fourth claimed, waiting for the sink. A relay in a new process on
// the file takes the killed relay's claims back once they have run out,
// and publishes what is left. Every message is published at least once and
// ends done, none is lost; a message marked done before the kill is not
// published again; those published again are exactly the ones the killed
// relay published under a claim it still held, each at attempt 2 (the
// claim that ran out counted), and only after that claim ran out; the
// messages of each ordering key are published in order across the crash.
func TestProofRelayKilledBetweenPublishAndMark(t *testing.T) {
	const messages, keys = 40, 4
	r := newRig(t)
	runner := idempotency.NewRunner(r.store, idempotency.WithTransaction(true))
	// Half of the messages on 4 ordering keys, interleaved with messages
	// of keys of their own: one record each.
	var ids []string
	for i := range messages {
		m := outbox.Message{Topic: "proof.paid", Payload: fmt.Appendf(nil, "%d", i)}
		if i%2 == 0 {
			m.OrderingKey = fmt.Sprintf("acct-%d", i/2%keys)
		}
		res, err := idempotency.Do(ctx, runner, idempotency.Call{Name: "pay", Key: fmt.Sprintf("relay-%02d", i)},
			func(ctx context.Context) ([]string, error) { return outbox.Enqueue(ctx, m) })
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.Value...)
	}

	bin, args := childproc.Self("TestProofRelayProcess")
	start := func(name string, env ...string) *childproc.Process {
		env = append([]string{proofRelayEnv + "=" + name, proofFileEnv + "=" + r.file}, env...)
		return childproc.Start(t, name, proofLinePrefix, bin, args, env, r.lines)
	}
	killed := start("relay-1", proofRelayHoldEnv+"=3")
	r.await(killed, "HELD", "3", 30*time.Second)
	first := r.publications(killed)
	// The relay claims its next batch while the sink holds this one (and
	// extends both claims): kill it once it has.
	waitFor(t, 10*time.Second, "the next batch claimed", func() bool {
		for id, row := range r.outboxRows() {
			if row.status == "claimed" && !slices.ContainsFunc(first, func(p publication) bool { return p.id == id }) {
				return true
			}
		}
		return false
	})
	killed.Kill()
	killedAt := time.Now()
	first = append(first, r.publications(killed)...)
	atKill := r.outboxRows()

	// At the kill: the held call's messages published and claimed; every
	// message the killed relay published is done, or still claimed by it.
	published1 := map[string]bool{}
	var held []string
	for _, p := range first {
		if p.attempt != 1 || published1[p.id] {
			t.Fatalf("the killed relay published %s at attempt %d (published before: %v)", p.id, p.attempt, published1[p.id])
		}
		published1[p.id] = true
		if p.call == 3 {
			held = append(held, p.id)
		}
	}
	if len(held) == 0 {
		t.Fatal("the held call published nothing")
	}
	claimed := map[string]bool{} // by the killed relay, at the kill
	doneAtKill := map[string]bool{}
	for _, id := range ids {
		row := atKill[id]
		switch {
		case row.status == "claimed" && row.claimedBy == "relay-1" && row.attempts == 0:
			claimed[id] = true
		case row.status == "done" && row.attempts == 1 && published1[id]:
			doneAtKill[id] = true
		case row.status != "ready" || row.attempts != 0 || published1[id]:
			t.Fatalf("%s at the kill: %+v (published by the killed relay: %v)", id, row, published1[id])
		}
	}
	for _, id := range held {
		if !claimed[id] {
			t.Fatalf("%s, published in the held call, is %+v at the kill, want claimed", id, atKill[id])
		}
	}

	survivor := start("relay-2")
	deadline := time.After(30 * time.Second)
	var second []publication
	seen := map[string]bool{}
	for {
		for _, p := range r.publications(survivor) {
			second = append(second, p)
			seen[p.id] = true
		}
		if len(seen) == len(ids)-len(doneAtKill) {
			break
		}
		select {
		case <-r.lines.Notify:
		case <-survivor.Exited():
			t.Fatal("the second relay exited")
		case <-deadline:
			t.Fatalf("the second relay published %d of the %d messages not done at the kill within 30s", len(seen), len(ids)-len(doneAtKill))
		}
	}
	// Its last marks commit: then nothing is left to publish.
	waitFor(t, 10*time.Second, "every message done", func() bool {
		for _, row := range r.outboxRows() {
			if row.status != "done" {
				return false
			}
		}
		return true
	})
	survivor.Stop(5 * time.Second)
	second = append(second, r.publications(survivor)...)

	final := r.outboxRows()
	published2 := map[string]int{}
	var republished []string
	for _, p := range second {
		published2[p.id]++
		want := 1
		if claimed[p.id] {
			want = 2 // the killed relay's claim, run out, counted
		}
		if p.attempt != want {
			t.Errorf("the second relay published %s at attempt %d, want %d", p.id, p.attempt, want)
		}
		if claimed[p.id] && p.at.Before(atKill[p.id].claimUntil) {
			t.Errorf("the second relay published %s at %v, before the killed relay's claim ran out at %v", p.id, p.at, atKill[p.id].claimUntil)
		}
		if published1[p.id] {
			republished = append(republished, p.id)
		}
	}
	for _, id := range ids {
		switch {
		case final[id].status != "done":
			t.Errorf("%s ends %+v, want done", id, final[id])
		case doneAtKill[id] && published2[id] != 0:
			t.Errorf("%s, done at the kill, published again", id)
		case !doneAtKill[id] && published2[id] != 1:
			t.Errorf("%s, not done at the kill, published %d times by the second relay, want 1", id, published2[id])
		case claimed[id] && final[id].attempts != 2, !claimed[id] && final[id].attempts != 1:
			t.Errorf("%s ends after %d attempts (claimed by the killed relay: %v)", id, final[id].attempts, claimed[id])
		}
	}
	// Republished: exactly the messages the killed relay published under
	// a claim it still held.
	var unmarked []string
	for id := range published1 {
		if claimed[id] {
			unmarked = append(unmarked, id)
		}
	}
	slices.Sort(unmarked)
	slices.Sort(republished)
	if !slices.Equal(republished, unmarked) {
		t.Errorf("republished %v, want the messages published and not marked at the kill %v", republished, unmarked)
	}
	// Each ordering key's messages in order across the crash: its rows
	// never go back, a message published again only right after itself.
	last := map[string]int64{}
	for _, p := range slices.Concat(first, second) {
		row := final[p.id]
		if row.rowID < last[row.key] {
			t.Errorf("key %s: %s (row %d) published after row %d", row.key, p.id, row.rowID, last[row.key])
		}
		last[row.key] = row.rowID
	}
	var firstAgain time.Duration
	for _, p := range second {
		if published1[p.id] {
			firstAgain = p.at.Sub(killedAt)
			break
		}
	}
	t.Logf("%d messages: %d published by the killed relay (%d done at the kill, %d in its held batch), %d claimed by it at the kill; "+
		"the second relay published %d, of which %d again, the first %v after the kill",
		len(ids), len(first), len(doneAtKill), len(held), len(claimed), len(second), len(republished), firstAgain.Round(time.Millisecond))
	// The sink takes a call once the marks of the batch two calls before
	// committed: the first batch was done at the kill; the next one was
	// claimed and not published.
	if len(doneAtKill) == 0 || len(claimed) == len(republished) {
		t.Errorf("the kill did not land with %d messages done, %d published and not marked, %d claimed and not published",
			len(doneAtKill), len(republished), len(claimed)-len(republished))
	}
	reliability.Report(t, reliability.Result{Scenario: "outbox: relay SIGKILLed between publish and mark-done", Store: "sqlite",
		Operations: int64(len(first) + len(second)), Faults: 1, Note: fmt.Sprintf("batches of 5, claim lease 1s, killed with its third batch published and unmarked, its fourth claimed: "+
			"the %d messages it held taken back by a relay in a new process once their claim ran out (attempt 2), the %d it had published delivered again with the same IDs (at least once), "+
			"none of the %d done at the kill; all %d done, each ordering key in order", len(claimed), len(republished), len(doneAtKill), len(ids))})
}

// compile-time check: the relay process's sink takes batches.
var _ outbox.BatchSink = (*reportSink)(nil)
