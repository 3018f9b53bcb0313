package outboxproof_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/brokers/nats/natsink"
	"github.com/go-idempotency/idempotency/brokers/nats/natstest"
	"github.com/go-idempotency/idempotency/internal/childproc"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/outbox/relay"
	"github.com/go-idempotency/idempotency/pgstore"
)

// The proofs of the outbox's lifecycle (lifecycle_*_test.go) run relay
// processes (TestLifecycleRelayProcess) that publish to a JetStream stream
// of their own through natsink, while the test poisons the table by hand,
// schedules messages, or stops a relay with SIGSTOP in the middle of a
// presentation and cancels or suspends its message meanwhile. A message
// whose headers carry holdHeader is held by the sink that presents it,
// before or after its publish, until the test opens the relay process's
// gate (SIGUSR1): that is how a test catches a relay with a message in
// its sink's hands.

// holdHeader names the header that makes a relay process's sink hold a
// message; its value says where.
const holdHeader = "Proof-Hold"

// The values of holdHeader.
const (
	// holdBefore: the sink holds the message before its publish until the
	// gate opens (then publishes it) or its context ends (then returns the
	// context's cause, unpublished), on every presentation.
	holdBefore = "before"
	// holdAfter: the sink publishes the message, then holds it until the
	// gate opens, whatever its context, and returns nil (confirmed), on
	// every presentation.
	holdAfter = "after"
	// holdAfterFirst is holdAfter on the first attempt only.
	holdAfterFirst = "after-first"
)

// The environment of a relay process of the lifecycle proofs, beside
// childDB, childName, childURL and childStream.
const (
	lcChildEnv   = "OUTBOXPROOF_LIFECYCLE_RELAY" // set: this process is a relay of the lifecycle proofs
	lcChildLease = "OUTBOXPROOF_LEASE"           // the claim lease
	lcChildPoll  = "OUTBOXPROOF_POLL"            // the poll interval
)

// relayConfig is how a rig's relay processes run.
type relayConfig struct {
	processes int
	lease     time.Duration
	poll      time.Duration
}

// rig is a lifecycle proof's world: a database of its own with the outbox,
// a private nats-server with a stream of the proof's own, a transactional
// Runner to enqueue with, and relay processes.
type rig struct {
	t       *testing.T
	dbURL   string
	pool    *pgxpool.Pool
	runner  *idempotency.Runner
	table   *lifecycle.Table
	natsURL string
	js      jetstream.JetStream
	stream  string
	subject string
	cfg     relayConfig

	log     *childproc.Lines
	procs   []*childproc.Process
	pids    map[*childproc.Process]int
	lines   []childproc.Line // every line the relay processes reported, in order
	stopped map[*childproc.Process]bool
}

// newRig creates the rig's database and stream; startRelays starts its
// relays.
func newRig(t *testing.T, cfg relayConfig) *rig {
	t.Helper()
	dbURL, pool := proofDB(t)
	store := pgstore.New(pool)
	t.Cleanup(func() { _ = store.Close() })
	table, err := outbox.Table(pgstore.DefaultOutboxTable)
	if err != nil {
		t.Fatal(err)
	}
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv.URL)
	id := randomID(t)
	r := &rig{
		t: t, dbURL: dbURL, pool: pool, table: table, natsURL: srv.URL, js: js, cfg: cfg,
		runner:  idempotency.NewRunner(store, idempotency.WithTransaction(true), idempotency.WithLease(10*time.Second)),
		stream:  "LIFECYCLE_" + strings.ToUpper(id),
		subject: "lifecycle." + id + ".event",
		log:     childproc.NewLines(),
		pids:    map[*childproc.Process]int{},
		stopped: map[*childproc.Process]bool{},
	}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: r.stream, Subjects: []string{r.subject}}); err != nil {
		t.Fatal(err)
	}
	// A relay a failed test leaves stopped is killed by childproc's
	// cleanup: SIGKILL ends a stopped process too.
	return r
}

// startRelays starts the rig's relay processes (TestLifecycleRelayProcess)
// and waits until each has reported its PID.
func (r *rig) startRelays() {
	r.t.Helper()
	for range r.cfg.processes {
		r.startRelay("TestLifecycleRelayProcess", lcChildEnv+"=1", childURL+"="+r.natsURL, childStream+"="+r.stream)
	}
}

// startRelay starts a relay process running the test function test, with
// the rig's database, lease and poll interval and env, and waits until it
// has reported its PID.
func (r *rig) startRelay(test string, env ...string) *childproc.Process {
	r.t.Helper()
	name := fmt.Sprint("lifecycle-relay-", len(r.procs))
	env = append(env, childDB+"="+r.dbURL, childName+"=outboxproof-"+name,
		lcChildLease+"="+r.cfg.lease.String(), lcChildPoll+"="+r.cfg.poll.String())
	bin, args := childproc.Self(test)
	p := childproc.Start(r.t, name, linePrefix, bin, args, env, r.log)
	r.procs = append(r.procs, p)
	r.await(0, 30*time.Second, "READY of "+name, func(l childproc.Line) bool { return l.Kind == "READY" && l.From == p })
	return p
}

// stopRelays stops the relay processes (continuing a stopped one first),
// waits for them to exit, and collects their last lines.
func (r *rig) stopRelays() {
	for _, p := range r.procs {
		if r.stopped[p] {
			r.signal(p, syscall.SIGCONT)
		}
		p.Stop(15 * time.Second)
	}
	r.pull()
}

// pull adds the lines reported since the last pull to r.lines, and notes
// the PIDs the relays report.
func (r *rig) pull() {
	for _, l := range r.log.Take() {
		if l.Kind == "READY" {
			pid, err := strconv.Atoi(l.Text)
			if err != nil {
				r.t.Fatalf("%s: READY %q", l.From.Name, l.Text)
			}
			r.pids[l.From] = pid
		}
		r.lines = append(r.lines, l)
	}
}

// mark returns the position in r.lines from which await looks for lines
// reported from now on.
func (r *rig) mark() int {
	r.pull()
	return len(r.lines)
}

// await returns the first line at or after position from in r.lines that
// match accepts, and its position, waiting up to within for it; it fails
// the test, saying what it waited for, when none comes.
func (r *rig) await(from int, within time.Duration, what string, match func(childproc.Line) bool) (childproc.Line, int) {
	r.t.Helper()
	l, i, ok := r.awaitMaybe(from, within, match)
	if !ok {
		r.t.Fatalf("no %s within %v; the outbox: %s", what, within, outboxState(r.t, r.pool))
	}
	return l, i
}

// awaitMaybe is await, reporting with ok whether the line came.
func (r *rig) awaitMaybe(from int, within time.Duration, match func(childproc.Line) bool) (l childproc.Line, i int, ok bool) {
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for i = from; ; {
		r.pull()
		for ; i < len(r.lines); i++ {
			if match(r.lines[i]) {
				return r.lines[i], i, true
			}
		}
		select {
		case <-r.log.Notify:
		case <-deadline.C:
			return childproc.Line{}, 0, false
		}
	}
}

// about returns a match for await: a line of kind about message id, from
// the process p (any when nil).
func about(kind, id string, p *childproc.Process) func(childproc.Line) bool {
	return func(l childproc.Line) bool {
		return l.Kind == kind && field(l, 0) == id && (p == nil || l.From == p)
	}
}

// signal sends sig to the relay process p, by the PID it reported.
func (r *rig) signal(p *childproc.Process, sig syscall.Signal) {
	r.t.Helper()
	pid, ok := r.pids[p]
	if !ok {
		r.t.Fatalf("%s reported no PID", p.Name)
	}
	select {
	case <-p.Exited():
		r.t.Fatalf("%s exited before %v", p.Name, sig)
	default:
	}
	if err := syscall.Kill(pid, sig); err != nil {
		r.t.Fatalf("%v to %s (%d): %v", sig, p.Name, pid, err)
	}
	switch sig {
	case syscall.SIGSTOP:
		r.stopped[p] = true
	case syscall.SIGCONT:
		r.stopped[p] = false
	}
}

// enqueue commits msgs, their topic the rig's subject, in a
// transactional call of key, and returns their IDs.
func (r *rig) enqueue(key string, msgs ...outbox.Message) []string {
	r.t.Helper()
	ids, err := r.tryEnqueue(key, msgs...)
	if err != nil {
		r.t.Fatalf("enqueue %s: %v", key, err)
	}
	return ids
}

// tryEnqueue is enqueue, returning its error, for goroutines.
func (r *rig) tryEnqueue(key string, msgs ...outbox.Message) ([]string, error) {
	for i := range msgs {
		msgs[i].Topic = r.subject
	}
	call := idempotency.Call{Name: "enqueue", Key: key, Payload: []byte(key)}
	res, err := idempotency.Do(context.Background(), r.runner, call, func(ctx context.Context) ([]string, error) {
		return outbox.Enqueue(ctx, msgs...)
	})
	return res.Value, err
}

// enqueueMany commits n messages made by mk (given 0 to n-1), in calls of
// up to per messages keyed prefix and the call's number, from four
// goroutines, and returns their payloads by message ID.
func (r *rig) enqueueMany(prefix string, n, per int, mk func(i int) outbox.Message) map[string]string {
	r.t.Helper()
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs = make(chan error, 4)
	)
	got := map[string]string{}
	calls := (n + per - 1) / per
	for g := range 4 {
		wg.Go(func() {
			for c := g; c < calls; c += 4 {
				var msgs []outbox.Message
				for i := c * per; i < min(n, (c+1)*per); i++ {
					msgs = append(msgs, mk(i))
				}
				ids, err := r.tryEnqueue(fmt.Sprint(prefix, c), msgs...)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				for i, id := range ids {
					got[id] = string(msgs[i].Payload)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		r.t.Fatal(err)
	}
	return got
}

// row is a message's row, as the proofs check it.
type row struct {
	ID         string
	Status     lifecycle.State
	Attempts   int
	LastError  string
	ClaimedBy  string
	FinishedAt time.Time
	Reason     string // suspended_reason
}

// rows reads the rows of the outbox, by message ID.
func (r *rig) rows() map[string]row {
	r.t.Helper()
	q, err := r.pool.Query(context.Background(), `
		SELECT storage_key, seq, status, attempts, coalesce(last_error, ''), coalesce(claimed_by, ''),
			finished_at, coalesce(suspended_reason, '')
		FROM idempotency_outbox`)
	if err != nil {
		r.t.Fatal(err)
	}
	defer q.Close()
	out := map[string]row{}
	for q.Next() {
		var w row
		var key string
		var seq int32
		var finished *time.Time
		if err := q.Scan(&key, &seq, &w.Status, &w.Attempts, &w.LastError, &w.ClaimedBy, &finished, &w.Reason); err != nil {
			r.t.Fatal(err)
		}
		if finished != nil {
			w.FinishedAt = *finished
		}
		w.ID = outbox.ID(key, int(seq))
		out[w.ID] = w
	}
	if err := q.Err(); err != nil {
		r.t.Fatal(err)
	}
	return out
}

// row reads one message's row.
func (r *rig) row(id string) row {
	r.t.Helper()
	w, ok := r.rows()[id]
	if !ok {
		r.t.Fatalf("message %s is not in the outbox", id)
	}
	return w
}

// awaitFinished waits up to within until every message of the outbox but
// those of except is finished.
func (r *rig) awaitFinished(within time.Duration, except ...string) {
	r.t.Helper()
	tick := time.NewTicker(50 * time.Millisecond) // the table's state has no notification
	defer tick.Stop()
	deadline := time.After(within)
	for {
		open := 0
		for id, w := range r.rows() {
			if !w.Status.IsTerminal() && !slices.Contains(except, id) {
				open++
			}
		}
		if open == 0 {
			return
		}
		select {
		case <-tick.C:
			r.pull()
		case <-deadline:
			r.t.Fatalf("%d messages not finished within %v: %s", open, within, outboxState(r.t, r.pool))
		}
	}
}

// awaitState waits up to within until the message id is in state.
func (r *rig) awaitState(id string, state lifecycle.State, within time.Duration) row {
	r.t.Helper()
	tick := time.NewTicker(20 * time.Millisecond) // the table's state has no notification
	defer tick.Stop()
	deadline := time.After(within)
	for {
		w := r.row(id)
		if w.Status == state {
			return w
		}
		select {
		case <-tick.C:
			r.pull()
		case <-deadline:
			r.t.Fatalf("%s is %s after %v, want %s", id, w.Status, within, state)
		}
	}
}

// clock reads the database's clock.
func (r *rig) clock() time.Time {
	r.t.Helper()
	var now time.Time
	if err := r.pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&now); err != nil {
		r.t.Fatal(err)
	}
	return now
}

// stored is a copy of a message in the stream.
type stored struct {
	payload string
	at      time.Time // when the server stored it, on its clock
}

// storedMessages reads the stream: the copies of each message ID, in the
// stream's order.
func (r *rig) storedMessages() map[string][]stored {
	r.t.Helper()
	ctx := context.Background()
	st, err := r.js.Stream(ctx, r.stream)
	if err != nil {
		r.t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	got := map[string][]stored{}
	if info.State.Msgs == 0 {
		return got
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		r.t.Fatal(err)
	}
	for range info.State.Msgs {
		msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			r.t.Fatal(err)
		}
		meta, err := msg.Metadata()
		if err != nil {
			r.t.Fatal(err)
		}
		id := msg.Headers().Get(jetstream.MsgIDHeader)
		got[id] = append(got[id], stored{payload: string(msg.Data()), at: meta.Timestamp})
	}
	return got
}

// lineCounts counts the lines the relays reported by kind, and the relay
// events (EVENT lines) by the event's kind.
func (r *rig) lineCounts() map[string]int {
	r.pull()
	n := map[string]int{}
	for _, l := range r.lines {
		n[l.Kind]++
		if l.Kind == "EVENT" {
			kind, _, _ := strings.Cut(l.Text, " ")
			n["event "+kind]++
		}
	}
	return n
}

// field returns the i-th space-separated field of a line's text.
func field(l childproc.Line, i int) string {
	f := strings.Fields(l.Text)
	if i < len(f) {
		return f[i]
	}
	return ""
}

// gate holds messages in a relay process's sink until SIGUSR1 opens it,
// releasing every message held then.
type gate struct {
	mu   sync.Mutex
	open chan struct{}
}

// newGate returns a gate opened by each SIGUSR1 the process receives.
func newGate() *gate {
	g := &gate{open: make(chan struct{})}
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	go func() {
		for range usr1 {
			g.mu.Lock()
			close(g.open)
			g.open = make(chan struct{})
			g.mu.Unlock()
		}
	}()
	return g
}

// next returns the channel the next opening closes: take it before
// reporting the message held, so that no opening is missed.
func (g *gate) next() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open
}

// oneLine is err's text on one line.
func oneLine(err error) string { return strings.ReplaceAll(fmt.Sprint(err), "\n", "; ") }

// TestLifecycleRelayProcess is a relay process of the lifecycle proofs,
// started by a rig; run by itself it is skipped. It relays the outbox
// through natsink until SIGTERM, with the rig's lease and poll interval, a
// concurrency of 4 and batches of 50. It reports on stdout:
//
//	READY pid
//	PRESENT id attempt unix-nanoseconds hold   the sink got the message ("-": no hold)
//	HELD id before|after                       the sink holds it until the gate opens
//	ABORTED id claim-lost unix-nanoseconds cause
//	                                           the sink's context ended while it held it
//	PUBLISHED id duplicate                     JetStream acknowledged it
//	FAILED id error                            the publish failed
//	RETURNED id                                a message held after its publish was let go
//	EVENT kind id state published error        a relay event (not published, claimed,
//	                                           extended, released, lag, purged)
func TestLifecycleRelayProcess(t *testing.T) {
	if os.Getenv(lcChildEnv) == "" {
		t.Skip("a relay process of the lifecycle proofs")
	}
	childproc.WatchLifeline()
	g := newGate()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	lease, err := time.ParseDuration(os.Getenv(lcChildLease))
	if err != nil {
		t.Fatal(err)
	}
	poll, err := time.ParseDuration(os.Getenv(lcChildPoll))
	if err != nil {
		t.Fatal(err)
	}
	name := os.Getenv(childName)

	cfg, err := pgxpool.ParseConfig(os.Getenv(childDB))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = name
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	nc, err := nats.Connect(os.Getenv(childURL), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ns := natsink.New(js, natsink.WithStream(os.Getenv(childStream)))

	out := &childproc.Reporter{Prefix: linePrefix}
	out.Report("READY", "%d", os.Getpid())
	sink := outbox.SinkFunc(func(ctx context.Context, e outbox.Envelope) error {
		hold := e.Headers[holdHeader]
		if hold == holdAfterFirst {
			hold = ""
			if e.Attempt == 1 {
				hold = holdAfter
			}
		}
		out.Report("PRESENT", "%s %d %d %s", e.ID, e.Attempt, time.Now().UnixNano(), cmp.Or(hold, "-"))
		if hold == holdBefore {
			open := g.next()
			out.Report("HELD", "%s before", e.ID)
			select {
			case <-ctx.Done():
				cause := context.Cause(ctx)
				out.Report("ABORTED", "%s %t %d %s", e.ID, errors.Is(cause, outbox.ErrClaimLost), time.Now().UnixNano(), oneLine(cause))
				return cause
			case <-open:
			}
		}
		ack, err := ns.PublishAck(ctx, e)
		if err != nil {
			out.Report("FAILED", "%s %s", e.ID, oneLine(err))
			return err
		}
		out.Report("PUBLISHED", "%s %t", e.ID, ack.Duplicate)
		if hold == holdAfter {
			open := g.next()
			out.Report("HELD", "%s after", e.ID)
			<-open
			out.Report("RETURNED", "%s", e.ID)
		}
		return nil
	})
	r := relay.New(pool, sink,
		relay.WithName(name),
		relay.WithClaimLease(lease),
		relay.WithPollInterval(poll),
		relay.WithBackoff(50*time.Millisecond, time.Second),
		relay.WithConcurrency(4),
		relay.WithBatchSize(50),
		relay.WithObserver(func(_ context.Context, e relay.Event) {
			switch e.Kind {
			case relay.EventPublished, relay.EventClaimed, relay.EventExtended, relay.EventReleased, relay.EventLag, relay.EventPurged:
				return
			}
			out.Report("EVENT", "%s %s %s %t %s", e.Kind, cmp.Or(e.ID, "-"), cmp.Or(string(e.State), "-"), e.Published, oneLine(e.Err))
		}))
	if err := r.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}
