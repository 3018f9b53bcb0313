package pgstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/pglisten"
)

// Watch implements idempotency.Store. The complete and release statements
// send pg_notify on the Store's channel (see WithChannel), with the
// record's key as payload, when a waiter has marked the record as watched.
// Watch registers the waiter with the Store's listening connection, waits
// until that connection is LISTENing, then marks the record (one
// statement on the pool). So an edge that commits after Watch returns
// notifies a connection that is already listening, and one that committed
// before is seen by the waiter's re-check. A record nobody watches is
// completed without a notification: PostgreSQL serializes the commits of
// all notifying transactions of a database, so they are kept for the
// records someone waits for. When there is no record at key, Watch marks
// nothing, and the edges of a record created later need not close the
// channel (the waiter's re-check finds the key free).
//
// All waiters of a Store share one listening connection, opened on the
// first Watch and kept until Close (see WithListenerConfig); the
// notifications of a key go to that key's waiters. The connection counts
// as dead when it breaks, or when it has been silent for the health-check
// interval (WithListenerHealthCheck) and a ping gets no reply within the
// same time. A dead connection is closed and every waiter woken (a
// spurious wake-up costs a re-check); a new one is connected, with a
// growing pause between failed attempts. A Watch that finds no connection
// listening waits for one until its context ends, or, when the context has
// no deadline, for at most twice the health-check interval. Watch returns
// by its context's deadline whatever the connections do. A notification
// sent while no connection listened is lost, which is why waiters bound
// their wait.
func (s *Store) Watch(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if s.closed.Load() {
		return nil, nil, idempotency.ErrStoreClosed
	}
	if err := checkText("key", key); err != nil {
		return nil, nil, err
	}
	changed, stop, err := s.hub.watch(ctx, key)
	if err != nil {
		return nil, nil, err
	}
	if _, err := s.pool.Exec(ctx, s.sql.mark, key); err != nil {
		stop()
		return nil, nil, fmt.Errorf("pgstore: watch %s: %w", key, err)
	}
	return changed, stop, nil
}

// hub holds the listening connection of a Store and its waiters. One
// goroutine (run) owns the connection: it connects, LISTENs, routes the
// notifications that arrive to the waiters of their key, pings a silent
// connection and replaces a dead one. Nothing that talks to the server
// runs under mu or on a waiter's goroutine.
type hub struct {
	connConfig *pgx.ConnConfig
	channel    string
	health     time.Duration

	ctx    context.Context // ends when the hub is closed
	cancel context.CancelFunc
	exited chan struct{} // closed when run returns

	mu        sync.Mutex
	started   bool
	closed    bool
	listening bool
	ready     chan struct{} // closed when a connection listens; replaced when it is dropped
	waiters   map[string]map[*waiter]struct{}
	pid       uint32 // the backend of the listening connection (tests)
	connects  int    // connections that reached LISTEN (tests)
}

type waiter struct {
	ch    chan struct{}
	fired bool
	// confirmed: a connection was listening when Watch returned the
	// waiter, so losing that connection must wake it.
	confirmed bool
}

func (w *waiter) fire() {
	if !w.fired {
		w.fired = true
		close(w.ch)
	}
}

func newHub(cfg *pgx.ConnConfig, channel string, health time.Duration) *hub {
	ctx, cancel := context.WithCancel(context.Background())
	return &hub{
		connConfig: cfg,
		channel:    channel,
		health:     health,
		ctx:        ctx,
		cancel:     cancel,
		exited:     make(chan struct{}),
		ready:      make(chan struct{}),
		waiters:    make(map[string]map[*waiter]struct{}),
	}
}

// watch registers a waiter on key and returns once a connection listens,
// with the waiter's channel and the function that removes it.
func (h *hub) watch(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if err := context.Cause(ctx); err != nil {
		return nil, nil, err
	}
	w := &waiter{ch: make(chan struct{})}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, nil, idempotency.ErrStoreClosed
	}
	if !h.started {
		h.started = true
		go h.run()
	}
	ws := h.waiters[key]
	if ws == nil {
		ws = make(map[*waiter]struct{})
		h.waiters[key] = ws
	}
	ws[w] = struct{}{}
	h.mu.Unlock()

	var once sync.Once
	stop := func() { once.Do(func() { h.leave(key, w) }) }

	var expired <-chan time.Time
	if _, ok := ctx.Deadline(); !ok {
		t := time.NewTimer(2 * h.health)
		defer t.Stop()
		expired = t.C
	}
	for {
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			stop()
			return nil, nil, idempotency.ErrStoreClosed
		}
		if h.listening {
			w.confirmed = true
			h.mu.Unlock()
			return w.ch, stop, nil
		}
		ready := h.ready
		h.mu.Unlock()
		select {
		case <-ready:
		case <-h.ctx.Done():
		case <-ctx.Done():
			stop()
			return nil, nil, context.Cause(ctx)
		case <-expired:
			stop()
			return nil, nil, fmt.Errorf("pgstore: no listening connection within %v", 2*h.health)
		}
	}
}

func (h *hub) leave(key string, w *waiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ws := h.waiters[key]
	delete(ws, w)
	if len(ws) == 0 {
		delete(h.waiters, key)
	}
}

// notify wakes the waiters of key.
func (h *hub) notify(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.waiters[key] {
		w.fire()
	}
}

// run owns the listening connection until the hub is closed. Between
// failed connection attempts it pauses 50ms, doubling up to the
// health-check interval.
func (h *hub) run() {
	defer close(h.exited)
	pglisten.Run(h.ctx, h.connConfig, h.channel, h.health, h.health, pglisten.Events{
		Listening: func(pid uint32) {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.listening = true
			h.pid = pid
			h.connects++
			close(h.ready)
		},
		Notified: h.notify,
		Dropped: func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.listening = false
			h.ready = make(chan struct{})
			for _, ws := range h.waiters {
				for w := range ws {
					if w.confirmed {
						w.fire()
					}
				}
			}
		},
	})
}

// close stops run, which drops the connection, and wakes every waiter;
// Watch calls still waiting for a connection return
// idempotency.ErrStoreClosed.
func (h *hub) close() {
	h.mu.Lock()
	h.closed = true
	started := h.started
	for _, ws := range h.waiters {
		for w := range ws {
			w.fire()
		}
	}
	h.mu.Unlock()
	h.cancel()
	if started {
		<-h.exited
	}
}
