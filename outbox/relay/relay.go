package relay

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
)

// Relay publishes the messages of an outbox table through a Sink. It is
// safe for concurrent use; several relays, in one process or many, share a
// table and partition its messages. Create it with New and run it with
// Run.
type Relay struct {
	db    lifecycle.DB
	sink  outbox.Sink
	cfg   config
	table *lifecycle.Table
	// batchSink is sink, when it publishes a batch at once.
	batchSink outbox.BatchSink
	// listen puts a wake-up on wake for every transaction that commits
	// messages, until ctx ends; nil when nothing wakes the relay but its
	// poll.
	listen func(ctx context.Context, wake chan<- struct{})

	// random is the jitter of the backoff (tests replace it).
	random func() float64
}

// New returns a relay that publishes the messages of the outbox table (see
// WithTable) of the PostgreSQL database pool connects to through sink. The
// table is created by pgstore.Migrate (or the SQL of pgstore.Schema). New
// makes no connection; Run does. The relay does not close pool. It panics
// when pool or sink is nil, or an option is invalid.
func New(pool *pgxpool.Pool, sink outbox.Sink, opts ...Option) *Relay {
	if pool == nil {
		panic("relay: New: nil pool")
	}
	cfg := newConfig("New", sink, opts)
	if cfg.listener == nil {
		cfg.listener = pool.Config().ConnConfig.Copy()
	}
	table, err := outbox.Table(cfg.table.String())
	if err != nil { // WithTable checked the name
		panic("relay: New: " + err.Error())
	}
	r := newRelay(lifecycle.Pgx(pool), table, sink, cfg)
	r.listen = r.listenPostgres
	return r
}

// NewDB returns a relay that publishes the messages of the outbox table
// through sink, on db: a database that has no notifications of its own
// (sqlitestore's, whose Store.Relay calls NewDB). The relay finds new
// messages when it polls (WithPollInterval), and when wake, if not nil,
// receives: a channel on which the process signals the commits of
// messages. WithTable and WithListenerConfig do not apply. NewDB makes no
// connection. It panics when db, table or sink is nil, or an option is
// invalid.
func NewDB(db lifecycle.DB, table *lifecycle.Table, wake <-chan struct{}, sink outbox.Sink, opts ...Option) *Relay {
	if db == nil || table == nil {
		panic("relay: NewDB: nil DB or Table")
	}
	r := newRelay(db, table, sink, newConfig("NewDB", sink, opts))
	if wake != nil {
		r.listen = func(ctx context.Context, w chan<- struct{}) {
			for {
				select {
				case <-ctx.Done():
					return
				case <-wake:
					signal(w)
				}
			}
		}
	}
	return r
}

// newConfig applies opts for the constructor named by.
func newConfig(by string, sink outbox.Sink, opts []Option) config {
	if sink == nil {
		panic("relay: " + by + ": nil Sink")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			panic("relay: " + by + ": nil Option")
		}
		o(&cfg)
	}
	if cfg.name == "" {
		cfg.name = defaultName()
	}
	if cfg.logger != nil {
		cfg.observer = logged(cfg.logger, cfg.observer)
	}
	return cfg
}

func newRelay(db lifecycle.DB, table *lifecycle.Table, sink outbox.Sink, cfg config) *Relay {
	r := &Relay{db: db, sink: sink, cfg: cfg, table: table, random: rand.Float64}
	r.batchSink, _ = sink.(outbox.BatchSink)
	return r
}

// Name returns the relay's name (WithName).
func (r *Relay) Name() string { return r.cfg.name }

// RepublishAfter returns the longest time after which the relay can
// publish again a message that the broker had stored, while the broker
// answers and a relay runs: the claim lease plus the poll interval (a
// relay died, or lost its database, between the broker's confirm and its
// mark: the message is claimed again once the lease ran out), or the
// backoff cap (a confirm that never arrived), whichever is longer. A
// broker that drops the publications of an ID it stored within a window
// (JetStream's Duplicates) stores each message once when the window is at
// least this, plus the outages to ride out: check it at start, as
// natsink.CheckDuplicates does.
func (r *Relay) RepublishAfter() time.Duration {
	return max(r.cfg.lease+r.cfg.poll, r.cfg.backoffMax)
}

// stateEvery is how often a busy relay takes back claims that ran out and
// reads its lag; an idle one does both whenever it wakes.
const stateEvery = time.Second

// purgeEvery is how often the relay purges, at most.
const purgeEvery = time.Minute

// Run relays messages until ctx ends, and then returns ctx's cause. It
// listens for the notifications of transactions that commit messages on a
// connection of its own (see WithListenerConfig), and repeats:
//
//   - claim: up to a batch of due messages (see WithBatchSize), at most one
//     of each ordering key, under a claim lease (WithClaimLease); a row it
//     cannot read is set apart alone, dead with the error, and the batch
//     goes on;
//   - present the batch to the sink: in one PublishBatch call when the sink
//     is an outbox.BatchSink (natsink's and idemrabbit's sinks are), which
//     keeps a window of publications waiting for their confirms, or else
//     one Publish per message, WithConcurrency at a time; the claim is
//     extended every third of a lease while the sink works;
//   - mark the outcomes: those the sink confirmed done, in one statement,
//     each that failed waiting for a retry after a backoff (WithBackoff) or
//     dead at the attempt cap (WithMaxAttempts), each the sink refused
//     permanently (outbox.Permanent) dead at once, and each the sink
//     suspended (outbox.Suspend) suspended; the marks are fenced by the
//     claim, so a relay whose claim was lost (taken back, or the message
//     canceled or suspended by an operator) marks nothing;
//   - after a batch that found messages, claim again at once; otherwise
//     purge finished messages past the retention (WithRetention), and wait
//     for a notification, the next message to fall due (a schedule, a
//     retry) or claim to run out, or the poll interval (WithPollInterval),
//     whichever comes first;
//   - before a claim that does not follow a batch that found messages (and
//     once a second while busy), take back the claims of any relay that ran
//     out (each counts an attempt), and report the lag.
//
// The three steps of a batch overlap with those of the next and the
// previous: while the sink presents a batch, the marks of the batch before
// are written and the next batch is claimed, so that the database and the
// broker work at once rather than in turn. The next batch holds no message
// of an ordering key whose message is in flight: a key's next message is
// claimed only once the mark of the previous one has committed. At most
// three batches are held at once: one claimed and waiting, one with the
// sink, one being marked.
//
// A statement that fails (the database is unreachable, a connection was
// killed) is reported (EventError, and logged with WithLogger) and the
// relay goes on after a pause; messages it had claimed are taken back
// after their lease. When ctx ends, the publishes in flight run to their
// end, no longer extended (the sink's context is cancelled when the claim
// runs out), and are marked, the messages claimed and not yet presented
// are handed back, and Run returns. Run may be called again after it
// returned.
func (r *Relay) Run(ctx context.Context) error {
	wake := make(chan struct{}, 1)
	lctx, stopListening := context.WithCancel(ctx)
	listening := make(chan struct{})
	go func() {
		defer close(listening)
		if r.listen != nil {
			r.listen(lctx, wake)
		}
	}()
	defer func() {
		stopListening()
		<-listening
	}()

	p := r.startPipeline(ctx)
	defer p.close()

	var (
		lastState time.Time
		lastPurge time.Time
		busy      bool          // the last claim found messages
		next      time.Duration // until something falls due, as tend last read it
		pause     time.Duration // after a failed statement
	)
	for {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		drain(wake) // a notification from now on wakes the next wait
		// Before the claim, so that whatever falls due after this reading
		// is either claimed now or in next.
		if !busy || time.Since(lastState) >= stateEvery {
			var err error
			next, err = r.tend(ctx)
			lastState = time.Now()
			if err != nil && ctx.Err() == nil {
				r.emit(ctx, Event{Kind: EventError, Err: err})
			}
		}
		b, err := r.claimBatch(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			r.emit(ctx, Event{Kind: EventError, Err: err})
			pause = min(max(2*pause, 50*time.Millisecond), r.cfg.poll)
			busy = false
			r.wait(ctx, pause, nil)
			continue
		}
		pause = 0
		if b != nil {
			busy = true
			if !p.hand(ctx, b) {
				r.mark(ctx, b) // hands the batch back: none of it was presented
			}
			continue
		}
		if p.busy() {
			// The batches in flight hold their keys' next messages back
			// until their marks commit, and may schedule retries: claim
			// again once they are marked.
			p.await(ctx)
			continue
		}
		if busy {
			// The batches that just ended may have scheduled retries: read
			// them (and claim once more) before waiting.
			busy = false
			continue
		}
		if time.Since(lastPurge) >= min(purgeEvery, r.cfg.retention) {
			if err := r.purge(ctx); err != nil && ctx.Err() == nil {
				r.emit(ctx, Event{Kind: EventError, Err: err})
			}
			lastPurge = time.Now()
		}
		r.wait(ctx, min(next, r.cfg.poll), wake)
	}
}

// wait waits for d, a wake-up on wake (nil: none) or the end of ctx.
func (r *Relay) wait(ctx context.Context, d time.Duration, wake <-chan struct{}) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-wake:
	case <-ctx.Done():
	}
}

// drain empties wake.
func drain(wake chan struct{}) {
	select {
	case <-wake:
	default:
	}
}

// signal puts a wake-up on wake, unless one is already there.
func signal(wake chan<- struct{}) {
	select {
	case wake <- struct{}{}:
	default:
	}
}

// tend takes back the claims that ran out, reports the lag, and returns
// how long an idle relay may wait before something falls due that is not
// due yet: the next scheduled message or retry, or the next claim to run
// out (at most the poll interval).
func (r *Relay) tend(ctx context.Context) (time.Duration, error) {
	if err := r.reclaim(ctx); err != nil {
		return r.cfg.poll, err
	}
	st, err := r.table.RelayState(ctx, r.db)
	if err != nil {
		return r.cfg.poll, fmt.Errorf("relay: %w", err)
	}
	r.emit(ctx, Event{Kind: EventLag, Lag: st.Lag})
	next := r.cfg.poll
	for _, d := range []time.Duration{st.NextDue, st.NextExpiry} {
		if d > 0 {
			// A little past the instant, so that the claim or
			// statement that follows finds it due.
			next = min(next, d+time.Millisecond)
		}
	}
	return max(next, time.Millisecond), nil
}

// reclaim takes back the claims that ran out, reporting each message.
func (r *Relay) reclaim(ctx context.Context) error {
	got, err := r.table.Reclaim(ctx, r.db, r.cfg.maxAttempts)
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	for _, m := range got {
		e := Event{Kind: EventReclaimed, ID: m.ID, Topic: m.Topic, Attempt: m.Attempts}
		if m.State == lifecycle.Dead {
			e.Kind, e.Reclaimed, e.Err = EventDead, true, errClaimExpired
		}
		r.emit(ctx, e)
	}
	return nil
}

// purgeBatch bounds the rows one purge statement deletes.
const purgeBatch = 1000

// purge deletes the finished messages past the retention, a batch at a
// time, until a batch comes back short.
func (r *Relay) purge(ctx context.Context) error {
	total := 0
	defer func() {
		if total > 0 {
			r.emit(ctx, Event{Kind: EventPurged, Count: total})
		}
	}()
	for {
		got, err := r.table.Purge(ctx, r.db, lifecycle.PurgeFilter{
			Selector: lifecycle.Selector{All: true}, Older: r.cfg.retention, Limit: purgeBatch,
		})
		if err != nil {
			return fmt.Errorf("relay: %w", err)
		}
		total += len(got)
		if len(got) < purgeBatch {
			return nil
		}
	}
}
