package outboxproof_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/internal/childproc"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
)

// The operator's edges racing running relays: a relay process is stopped
// (SIGSTOP) while its sink holds a message, before or after publishing it;
// the message is canceled or suspended meanwhile, or the relay stays
// stopped past its claim's lease; then it is continued (SIGCONT), and its
// sink let go a lease later, when the relay must have given the claim up
// whatever it did meanwhile (it counts the claim from before the statement
// that took or extended it, a tenth early). Meanwhile producers keep
// committing messages for the other relays. A message enqueued after the
// held one on its ordering key shows that the edge released the key, or
// held it.

// operatorLoad is how many other messages the producers commit during a
// run, and over how long.
func operatorLoad() (int, time.Duration) {
	if os.Getenv(longEnv) == "1" {
		return 2000, 20 * time.Second
	}
	return 150, 3 * time.Second
}

// The relays of the operator proofs: a lease short enough that a relay
// stopped past it is taken over within seconds.
const (
	opLease = 2 * time.Second
	opPoll  = 200 * time.Millisecond
)

// TestCancelRacingRelays: a message canceled (lifecycle's Cancel, as
// outbox.Cancel and idemctl outbox cancel run it) while the relay
// presenting it is stopped, its sink holding it before or after the
// publish. The relay, continued, cancels its sink's context with a cause
// wrapping outbox.ErrClaimLost before the claim could have run out, so
// that a sink holding the message unpublished never publishes it: the
// stream holds no copy stored after the cancel; the relay's marks are
// refused: the row stays canceled as the cancel left it (never done, its
// attempts not counted); the message after it on its ordering key is
// published after the cancel; every other message is published once.
func TestCancelRacingRelays(t *testing.T) {
	for _, hold := range []string{holdBefore, holdAfter} {
		t.Run("sink holding it "+hold+" its publish", func(t *testing.T) {
			run := startRace(t, hold)
			r, victim, follower := run.r, run.victim, run.follower
			changed, err := r.table.Cancel(context.Background(), lifecycle.Pgx(r.pool), []string{victim}, "proof: canceled while presented")
			if err != nil {
				t.Fatal(err)
			}
			if len(changed) != 1 || changed[0].ID != victim || changed[0].State != lifecycle.Canceled {
				t.Fatalf("Cancel(%s) changed %+v", victim, changed)
			}
			canceled := r.row(victim)
			run.continueRelay()
			run.letGo()

			run.finish()
			if w := r.row(victim); w != canceled {
				t.Errorf("the canceled message's row changed after the relay went on:\n  %+v\nwas\n  %+v", w, canceled)
			}
			got := r.storedMessages()
			for _, c := range got[victim] {
				if !c.at.Before(canceled.FinishedAt) {
					t.Errorf("%s was stored at %v, after the cancel at %v", victim, c.at, canceled.FinishedAt)
				}
			}
			if want := map[string]int{holdBefore: 0, holdAfter: 1}[hold]; len(got[victim]) != want {
				t.Errorf("%s is in the stream %d times, want %d", victim, len(got[victim]), want)
			}
			if f := got[follower]; len(f) != 1 || !f[0].at.After(canceled.FinishedAt) {
				t.Errorf("%s, after the canceled message on its key: %d copies (%v), want one stored after the cancel at %v", follower, len(f), f, canceled.FinishedAt)
			}
			if w := r.row(follower); w.Status != lifecycle.Done {
				t.Errorf("%s is %s", follower, w.Status)
			}
			run.checkLoad(got)
			run.report()
		})
	}
}

// TestSuspendRacingRelays: a message suspended (lifecycle's Suspend, as
// idemctl outbox suspend runs it) while the relay presenting it is
// stopped, its sink holding it before or after the publish; then resumed
// once every other message is done. The relay, continued, cancels its
// sink's context (outbox.ErrClaimLost) and its marks are refused: the row
// stays suspended, its attempts not counted, and the message after it on
// its ordering key is held back, unpublished, as long as it is suspended.
// Once resumed, it is presented again and published once more (exactly
// one more confirmed publication; held before its publish, its only copy
// in the stream is stored after the resume), done with one attempt
// counted for the presentation after the resume, and the message after it
// follows.
func TestSuspendRacingRelays(t *testing.T) {
	for _, hold := range []string{holdBefore, holdAfter} {
		t.Run("sink holding it "+hold+" its publish", func(t *testing.T) {
			run := startRace(t, hold)
			r, victim, follower := run.r, run.victim, run.follower
			suspendFrom := r.clock()
			changed, err := r.table.Suspend(context.Background(), lifecycle.Pgx(r.pool), lifecycle.Selector{IDs: []string{victim}}, "proof: held by an operator")
			if err != nil {
				t.Fatal(err)
			}
			if len(changed) != 1 || changed[0].ID != victim || changed[0].State != lifecycle.Suspended {
				t.Fatalf("Suspend(%s) changed %+v", victim, changed)
			}
			suspended := r.row(victim)
			run.continueRelay()
			run.letGo()

			// Everything else ends; the suspended message and the one after
			// it on its key stay as they are.
			run.waitLoad()
			r.awaitFinished(time.Minute, victim, follower)
			if w := r.row(victim); w != suspended {
				t.Errorf("the suspended message's row changed after the relay went on:\n  %+v\nwas\n  %+v", w, suspended)
			}
			if w := r.row(follower); w.Status != lifecycle.Ready {
				t.Errorf("%s, after the suspended message on its key, is %s, want ready", follower, w.Status)
			}
			stored := r.storedMessages()
			if n := len(stored[follower]); n != 0 {
				t.Errorf("%s, after the suspended message on its key, was published %d times while it was suspended", follower, n)
			}
			if n, want := len(stored[victim]), map[string]int{holdBefore: 0, holdAfter: 1}[hold]; n != want {
				t.Errorf("%s is in the stream %d times while suspended, want %d (published before the suspend, or not at all)", victim, n, want)
			}

			resumeFrom := r.clock()
			mark := r.mark()
			changed, err = r.table.Resume(context.Background(), lifecycle.Pgx(r.pool), lifecycle.Selector{IDs: []string{victim}})
			if err != nil {
				t.Fatal(err)
			}
			if len(changed) != 1 || changed[0].ID != victim || changed[0].State != lifecycle.Ready {
				t.Fatalf("Resume(%s) changed %+v", victim, changed)
			}
			held, _ := r.await(mark, 30*time.Second, "hold of "+victim+" after the resume", about("HELD", victim, nil))
			r.signal(held.From, syscall.SIGUSR1)
			run.finish()

			w := r.row(victim)
			if w.Status != lifecycle.Done || w.Attempts != suspended.Attempts+1 {
				t.Errorf("%s is %s after %d attempts, want done after %d (the suspension counting none)", victim, w.Status, w.Attempts, suspended.Attempts+1)
			}
			again := 0
			for _, l := range r.lines[mark:] {
				if about("PUBLISHED", victim, nil)(l) {
					again++
				}
			}
			if again != 1 {
				t.Errorf("%s was published %d times after the resume, want once", victim, again)
			}
			got := r.storedMessages()
			v := got[victim]
			if len(v) != 1 {
				t.Fatalf("%s is in the stream %d times, want once", victim, len(v))
			}
			switch hold {
			case holdBefore:
				if v[0].at.Before(resumeFrom) {
					t.Errorf("%s was stored at %v, before the resume at %v", victim, v[0].at, resumeFrom)
				}
			case holdAfter:
				if !v[0].at.Before(suspendFrom) {
					t.Errorf("%s was stored at %v, after the suspend at %v, before which it was published", victim, v[0].at, suspendFrom)
				}
			}
			if f := got[follower]; len(f) != 1 || f[0].at.Before(resumeFrom) || f[0].at.Before(v[0].at) {
				t.Errorf("%s, after the suspended message on its key: %d copies (%v), want one stored after the resume at %v and after %s (%v)",
					follower, len(f), f, resumeFrom, victim, v[0].at)
			}
			run.checkLoad(got)
			run.report()
		})
	}
}

// TestStoppedPastLease: a relay stopped after its sink published a message
// and before it returned, for longer than the claim's lease: another
// relay takes the message back (claim_expired, an attempt counted),
// publishes it again (JetStream acknowledges a duplicate) and marks it
// done. The stopped relay, continued and its sink returning the confirm,
// is fenced: its done mark changes nothing (the row stays as the other
// relay left it), and the stream holds the message once.
func TestStoppedPastLease(t *testing.T) {
	run := startRace(t, holdAfterFirst)
	r, victim, follower := run.r, run.victim, run.follower
	mark := r.mark()
	other, _ := r.await(mark, 3*opLease+30*time.Second, "presentation of "+victim+" by another relay", func(l childproc.Line) bool {
		return about("PRESENT", victim, nil)(l) && l.From != run.stopped
	})
	if attempt := field(other, 1); attempt != "2" {
		t.Errorf("%s presented again as attempt %s, want 2 (the claim that ran out counted)", victim, attempt)
	}
	done := r.awaitState(victim, lifecycle.Done, 30*time.Second)
	if done.ClaimedBy != "outboxproof-"+other.From.Name || done.Attempts != 2 {
		t.Errorf("%s done by %q after %d attempts, want by outboxproof-%s after 2", victim, done.ClaimedBy, done.Attempts, other.From.Name)
	}
	run.continueRelay()
	r.signal(run.stopped, syscall.SIGUSR1)
	r.await(run.held, 30*time.Second, "return of the stopped relay's sink", about("RETURNED", victim, run.stopped))
	run.refusedMark()

	run.finish()
	if w := r.row(victim); w != done {
		t.Errorf("the row changed after the stopped relay went on:\n  %+v\nwas\n  %+v", w, done)
	}
	got := r.storedMessages()
	if len(got[victim]) != 1 {
		t.Errorf("%s is in the stream %d times, want once", victim, len(got[victim]))
	}
	dup := false
	for _, l := range r.lines[mark:] {
		if about("PUBLISHED", victim, other.From)(l) && field(l, 1) == "true" {
			dup = true
		}
	}
	if !dup {
		t.Errorf("%s's second publication, by %s, was not acknowledged as a duplicate", victim, other.From.Name)
	}
	if f := got[follower]; len(f) != 1 || len(got[victim]) == 0 || f[0].at.Before(got[victim][0].at) {
		t.Errorf("%s, after %s on its key: %v, want one copy stored after it", follower, victim, f)
	}
	run.checkLoad(got)
	run.report()
}

// opRun is a run of an operator proof: a rig with three relays, a load of
// other messages, and the held message ("the victim") and the one after
// it on its ordering key ("the follower").
type opRun struct {
	t                *testing.T
	r                *rig
	victim, follower string
	stopped          *childproc.Process // the relay holding the victim
	held             int                // the position of its HELD line
	stoppedAt        time.Time
	continuedAt      time.Time

	loadDone chan loadResult
	load     map[string]string // the other messages' payloads, by ID
}

// startRace starts three relays and the load, enqueues the victim (held
// by the sink as hold says) and the follower, waits until a relay's sink
// holds the victim, and stops that relay.
func startRace(t *testing.T, hold string) *opRun {
	r := newRig(t, relayConfig{processes: 3, lease: opLease, poll: opPoll})
	r.startRelays()
	ids := r.enqueue("victim",
		outbox.Message{Payload: []byte("victim"), OrderingKey: "victim", Headers: map[string]string{holdHeader: hold}},
		outbox.Message{Payload: []byte("follower"), OrderingKey: "victim"})
	run := &opRun{t: t, r: r, victim: ids[0], follower: ids[1], loadDone: make(chan loadResult, 1)}
	ctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	go run.produce(ctx)
	where := map[string]string{holdBefore: "before", holdAfter: "after", holdAfterFirst: "after"}[hold]
	l, i := r.await(0, 30*time.Second, "hold of "+run.victim, func(l childproc.Line) bool {
		return about("HELD", run.victim, nil)(l) && field(l, 1) == where
	})
	run.stopped, run.held = l.From, i
	r.signal(run.stopped, syscall.SIGSTOP)
	run.stoppedAt = time.Now()
	return run
}

// produce commits the load, in calls of five messages of their own
// ordering keys, paced over the load's time, until the test ends, and
// hands their payloads, or the first error, to loadDone.
func (x *opRun) produce(ctx context.Context) {
	n, over := operatorLoad()
	calls := n / 5
	pace := time.NewTicker(over / time.Duration(calls))
	defer pace.Stop()
	got := map[string]string{}
	for c := range calls {
		select {
		case <-pace.C:
		case <-ctx.Done():
			x.loadDone <- loadResult{err: ctx.Err()}
			return
		}
		var msgs []outbox.Message
		for i := range 5 {
			p := fmt.Sprintf("load-%d-%d", c, i)
			msgs = append(msgs, outbox.Message{Payload: []byte(p), OrderingKey: p})
		}
		ids, err := x.r.tryEnqueue(fmt.Sprint("load-", c), msgs...)
		if err != nil {
			x.loadDone <- loadResult{err: fmt.Errorf("load call %d: %w", c, err)}
			return
		}
		for i, id := range ids {
			got[id] = string(msgs[i].Payload)
		}
	}
	x.loadDone <- loadResult{payloads: got}
}

// loadResult is what the load's producer committed.
type loadResult struct {
	payloads map[string]string // by message ID
	err      error
}

// waitLoad waits until the producer is done.
func (x *opRun) waitLoad() {
	if x.load != nil {
		return
	}
	res := <-x.loadDone
	if res.err != nil {
		x.t.Fatal(res.err)
	}
	x.load = res.payloads
}

// continueRelay continues the stopped relay, after it has been stopped
// half a lease: one extend at least is then due.
func (x *opRun) continueRelay() {
	time.Sleep(time.Until(x.stoppedAt.Add(opLease / 2))) // the stop itself
	x.r.signal(x.stopped, syscall.SIGCONT)
	x.continuedAt = time.Now()
}

// letGo opens the continued relay's gate once a lease has passed since it
// was continued (with a margin for a busy machine): by then the relay has
// given up its claim on the victim, even had every extend failed, and a
// sink that still holds the victim before its publish publishes it, for
// the stream to show. It then waits for the sink's outcome: with the
// victim held before its publish, its context must have ended with a
// cause wrapping outbox.ErrClaimLost, the victim unpublished; held after,
// the sink returns its confirm, whose done mark must be refused.
func (x *opRun) letGo() {
	r := x.r
	time.Sleep(time.Until(x.continuedAt.Add(opLease + opLease/4))) // the relay's time to give the claim up
	r.signal(x.stopped, syscall.SIGUSR1)
	l, _ := r.await(x.held, 30*time.Second, "outcome of the stopped relay's sink", func(l childproc.Line) bool {
		return l.From == x.stopped && field(l, 0) == x.victim && slices.Contains([]string{"ABORTED", "PUBLISHED", "RETURNED"}, l.Kind)
	})
	switch {
	case field(r.lines[x.held], 1) == "after":
		if l.Kind != "RETURNED" {
			x.t.Errorf("the stopped relay's sink, holding %s after its publish: %s %s", x.victim, l.Kind, l.Text)
		}
		x.refusedMark()
	case l.Kind != "ABORTED" || field(l, 1) != "true":
		x.t.Errorf("the stopped relay's sink, holding %s before its publish, a lease after the relay went on: %s %s, want ABORTED with a cause wrapping outbox.ErrClaimLost",
			x.victim, l.Kind, l.Text)
	default:
		ns, _ := strconv.ParseInt(field(l, 2), 10, 64)
		x.t.Logf("%s's sink context ended %v after SIGCONT: %s", x.stopped.Name, time.Unix(0, ns).Sub(x.continuedAt).Round(time.Millisecond), l.Text)
	}
}

// refusedMark waits for the stopped relay's report of its refused mark on
// the victim (EventCanceled or EventFenced), and logs it; the rows say
// whether the mark changed anything.
func (x *opRun) refusedMark() {
	l, _, ok := x.r.awaitMaybe(x.held, 10*time.Second, func(l childproc.Line) bool {
		return l.Kind == "EVENT" && l.From == x.stopped && field(l, 1) == x.victim &&
			slices.Contains([]string{"canceled", "fenced"}, field(l, 0))
	})
	if ok {
		x.t.Logf("%s: %s", x.stopped.Name, l.Text)
	} else {
		x.t.Logf("%s reported no refused mark of %s", x.stopped.Name, x.victim)
	}
}

// finish waits for the load, for every message to finish, and stops the
// relays.
func (x *opRun) finish() {
	x.waitLoad()
	x.r.awaitFinished(time.Minute)
	x.r.stopRelays()
}

// checkLoad checks that every message of the load is done, in the stream
// once with its payload.
func (x *opRun) checkLoad(got map[string][]stored) {
	rows := x.r.rows()
	n, _ := operatorLoad()
	if len(x.load) != n {
		x.t.Errorf("%d messages of the load committed, want %d", len(x.load), n)
	}
	for id, payload := range x.load {
		if w := rows[id]; w.Status != lifecycle.Done {
			x.t.Errorf("%s is %s (%s)", id, w.Status, w.LastError)
		}
		if cs := got[id]; len(cs) != 1 || cs[0].payload != payload {
			x.t.Errorf("%s is in the stream %v, want once with %q", id, cs, payload)
		}
	}
	for id := range got {
		if _, ok := x.load[id]; !ok && id != x.victim && id != x.follower {
			x.t.Errorf("the stream holds %s, which was never enqueued", id)
		}
	}
}

// report logs the run's counts.
func (x *opRun) report() {
	n := x.r.lineCounts()
	x.t.Logf("%s stopped for %v; %d other messages published once each; %d presentations, %d confirmed publications (%d duplicates); events: %d claim_lost, %d canceled, %d fenced, %d reclaimed, %d retried",
		x.stopped.Name, x.continuedAt.Sub(x.stoppedAt).Round(time.Millisecond), len(x.load), n["PRESENT"], n["PUBLISHED"], countDuplicates(x.r),
		n["event claim_lost"], n["event canceled"], n["event fenced"], n["event reclaimed"], n["event retried"])
}
