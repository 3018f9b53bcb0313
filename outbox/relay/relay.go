package relay

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency/outbox"
)

// Relay publishes the messages of an outbox table through a Sink. It is
// safe for concurrent use; several relays, in one process or many, share a
// table and partition its messages. Create it with New and run it with
// Run.
type Relay struct {
	pool *pgxpool.Pool
	sink outbox.Sink
	cfg  config
	sql  statements

	// random is the jitter of the backoff (tests replace it).
	random func() float64
}

// New returns a relay that publishes the messages of the outbox table (see
// WithTable) of the database pool connects to through sink. The table is
// created by pgstore.Migrate (or the SQL of pgstore.Schema). New makes no
// connection; Run does. The relay does not close pool. It panics when pool
// or sink is nil, or an option is invalid.
func New(pool *pgxpool.Pool, sink outbox.Sink, opts ...Option) *Relay {
	if pool == nil {
		panic("relay: New: nil pool")
	}
	if sink == nil {
		panic("relay: New: nil Sink")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			panic("relay: New: nil Option")
		}
		o(&cfg)
	}
	if cfg.name == "" {
		cfg.name = defaultName()
	}
	if cfg.listener == nil {
		cfg.listener = pool.Config().ConnConfig.Copy()
	}
	if cfg.logger != nil {
		cfg.observer = logged(cfg.logger, cfg.observer)
	}
	return &Relay{pool: pool, sink: sink, cfg: cfg, sql: newStatements(cfg.table), random: rand.Float64}
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
//     of each ordering key, under a claim lease (WithClaimLease);
//   - present each to the sink; mark those the sink confirmed done, in one
//     statement once the batch has been presented, and each that failed
//     pending again after a backoff (WithBackoff) or dead at the attempt
//     cap (WithMaxAttempts); the marks are fenced by the claim, so a relay
//     whose claim was taken back marks nothing;
//   - after a batch that found messages, claim again at once; otherwise
//     purge terminal messages past the retention (WithRetention), and wait
//     for a notification, the next retry or claim to run out, or the poll
//     interval (WithPollInterval), whichever comes first;
//   - before a claim that does not follow a batch that found messages (and
//     once a second while busy),
//     take back the claims of any relay that ran out (each counts an
//     attempt), and report the lag.
//
// A statement that fails (the database is unreachable, a connection was
// killed) is reported (EventError, and logged with WithLogger) and the
// relay goes on after a pause; messages it had claimed are taken back
// after their lease. When ctx ends, the publishes in flight run to their
// end (each bounded by its claim's lease) and are marked, the messages of
// the batch not yet presented are handed back, and Run returns. Run may be
// called again after it returned.
func (r *Relay) Run(ctx context.Context) error {
	wake := make(chan struct{}, 1)
	lctx, stopListening := context.WithCancel(ctx)
	listening := make(chan struct{})
	go func() {
		defer close(listening)
		r.listen(lctx, wake)
	}()
	defer func() {
		stopListening()
		<-listening
	}()

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
		n, err := r.round(ctx)
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
		if n > 0 {
			busy = true
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
// due yet: the next retry, or the next claim to run out (at most the poll
// interval).
func (r *Relay) tend(ctx context.Context) (time.Duration, error) {
	if err := r.reclaim(ctx); err != nil {
		return r.cfg.poll, err
	}
	var lag float64
	var nextRetry, nextExpiry *float64
	if err := r.pool.QueryRow(ctx, r.sql.state).Scan(&lag, &nextRetry, &nextExpiry); err != nil {
		return r.cfg.poll, fmt.Errorf("relay: state: %w", err)
	}
	r.emit(ctx, Event{Kind: EventLag, Lag: seconds(lag)})
	next := r.cfg.poll
	for _, s := range []*float64{nextRetry, nextExpiry} {
		if s != nil {
			// A little past the instant, so that the claim or
			// statement that follows finds it due.
			next = min(next, seconds(*s)+time.Millisecond)
		}
	}
	return max(next, time.Millisecond), nil
}

// seconds converts a number of seconds to a Duration.
func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// reclaim takes back the claims that ran out, reporting each message.
func (r *Relay) reclaim(ctx context.Context) error {
	rows, err := r.pool.Query(ctx, r.sql.reclaim, r.cfg.maxAttempts)
	if err != nil {
		return fmt.Errorf("relay: reclaim: %w", err)
	}
	type reclaimed struct {
		status, key, topic string
		seq, attempts      int
	}
	got, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (m reclaimed, err error) {
		err = row.Scan(&m.status, &m.key, &m.seq, &m.topic, &m.attempts)
		return m, err
	})
	if err != nil {
		return fmt.Errorf("relay: reclaim: %w", err)
	}
	for _, m := range got {
		e := Event{Kind: EventReclaimed, ID: outbox.ID(m.key, m.seq), Topic: m.topic, Attempt: m.attempts}
		if m.status == outbox.StatusDead {
			e.Kind, e.Reclaimed, e.Err = EventDead, true, errClaimExpired
		}
		r.emit(ctx, e)
	}
	return nil
}

// purgeBatch bounds the rows one purge statement deletes.
const purgeBatch = 1000

// purge deletes the terminal messages past the retention, a batch at a
// time, until a batch comes back short.
func (r *Relay) purge(ctx context.Context) error {
	total := 0
	defer func() {
		if total > 0 {
			r.emit(ctx, Event{Kind: EventPurged, Count: total})
		}
	}()
	for {
		tag, err := r.pool.Exec(ctx, r.sql.purge, r.cfg.retention, purgeBatch)
		if err != nil {
			return fmt.Errorf("relay: purge: %w", err)
		}
		total += int(tag.RowsAffected())
		if tag.RowsAffected() < purgeBatch {
			return nil
		}
	}
}
