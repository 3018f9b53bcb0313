package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/redis/go-redis/v9"
)

// Watch implements idempotency.Store. The complete and release scripts
// PUBLISH on the record's channel (see Channel) when a waiter has marked the
// record as watched. Watch subscribes to the channel and, once Redis has
// confirmed the subscription, marks the record (one more round trip), so a
// completion after Watch returns is not missed while the connection holds.
// A record that nobody watches is completed without a PUBLISH, which a
// Cluster would send to every node. When there is no record at key, Watch
// marks nothing, and the edges of a record created later need not close the
// channel: the waiter's re-check finds the key free. A value under key that
// is not a hash is reported as an error wrapping
// idempotency.ErrCorruptRecord.
//
// Watch returns by ctx's deadline whatever the connections do, even when
// the client does not stop calls at their context's deadline: it then
// returns ctx's error.
//
// All waiters of a Store share one pub/sub connection, opened on the first
// Watch: a channel is subscribed while at least one waiter watches it. The
// connection counts as dead when it breaks, or when a subscription
// confirmation or a PING's reply has not come within the reply timeout: the
// client's ReadTimeout (5s when that is not positive; at least 100ms).
// While a channel is subscribed, the Store sends a PING after half that
// time without hearing from the connection, so a node that stops answering
// (frozen, or cut off without a reset) is noticed within one and a half
// reply timeouts. A dead connection is closed and every waiter woken (a
// spurious wake-up only costs a re-check); the next Watch subscribes on a
// new connection. A Watch still waiting for its subscription goes on
// waiting for it on the new connection until its context ends, or, when
// the context has no deadline, for at most twice the reply timeout in all.
// On a Cluster a new connection goes to the master of the first channel it
// subscribes, which may be the node that stopped answering; it is then
// dropped in turn. A notification sent while the connection was dead is
// lost, which is why waiters bound their wait.
func (s *Store) Watch(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if s.closed.Load() {
		return nil, nil, idempotency.ErrStoreClosed
	}
	if key == "" {
		return nil, nil, errors.New("redisstore: empty key")
	}
	rkey, channel := s.RecordKey(key), s.Channel(key)
	changed, stop, err := s.hub.watch(ctx, channel)
	if err != nil {
		return nil, nil, err
	}
	if err := s.mark(ctx, rkey); err != nil {
		stop()
		return nil, nil, err
	}
	return changed, stop, nil
}

// mark runs the watch script on the record at rkey, returning by ctx's
// deadline (see bounded).
func (s *Store) mark(ctx context.Context, rkey string) error {
	reply, err := s.bounded(ctx, func(ctx context.Context) ([]any, error) {
		return watchScript.Run(ctx, s.calls, []string{rkey}).Slice()
	})
	if err != nil {
		return fmt.Errorf("redisstore: watch %s: %w", rkey, err)
	}
	code, err := replyCode(rkey, reply)
	if err == nil && code != watchMarked && code != watchNoRecord {
		err = fmt.Errorf("redisstore: watch %s: unexpected reply %v", rkey, reply)
	}
	return err
}

// defaultReplyTimeout is the reply timeout when the client's ReadTimeout is
// not positive (no timeout): go-redis's default ReadTimeout.
const defaultReplyTimeout = 5 * time.Second

// minReplyTimeout is the shortest reply timeout, whatever the client's
// ReadTimeout: below it a busy server would have its subscriptions dropped
// and every waiter woken over and over.
const minReplyTimeout = 100 * time.Millisecond

// replyTimeout returns how long the hub waits for a subscription
// confirmation or a PING's reply before it counts its connection as dead:
// the client's ReadTimeout, the time go-redis gives any reply before it
// gives up on a connection.
func replyTimeout(client redis.UniversalClient) time.Duration {
	var d time.Duration
	switch c := client.(type) {
	case *redis.Client:
		d = c.Options().ReadTimeout
	case *redis.ClusterClient:
		d = c.Options().ReadTimeout
	case *redis.Ring:
		d = c.Options().ReadTimeout
	}
	if d <= 0 {
		d = defaultReplyTimeout
	}
	return max(d, minReplyTimeout)
}

// hub multiplexes the waiters of one Store over a single pub/sub connection
// (a subConn). Nothing that talks to Redis runs under mu or in a waiter's
// goroutine: each connection has a writer goroutine sending its commands in
// order and a reader goroutine routing what arrives to the waiters of its
// channel. A timer per connection sends PINGs and drops the connection when
// a reply is overdue.
//
// Each channel has at most one SUBSCRIBE in flight on the connection: a
// topic stays in the map until its subscription is confirmed, even when its
// last waiter left, and is unsubscribed only then. So the next confirmation
// for a channel always belongs to the topic in the map. The topics are those
// of the current connection. When it is dropped, the confirmed topics go with it (their
// waiters are woken and watch again); the pending ones that still have
// waiters move to a new connection.
type hub struct {
	client redis.UniversalClient
	// replyTimeout: see replyTimeout. pingAfter: the silence after which
	// the hub pings a connection that has subscribed channels, and the
	// least time between two connections that were never heard from.
	replyTimeout, pingAfter time.Duration

	mu      sync.Mutex
	conn    *subConn // nil before the first Watch, when no waiter needed one since the last drop, after close
	topics  map[string]*topic
	closed  bool
	retryAt time.Time // the next connection sends nothing before
}

type topic struct {
	refs      int
	ready     chan struct{} // closed once subscribed, or failed
	confirmed bool
	err       error // why the subscription failed
	waiters   map[*waiter]struct{}
}

type waiter struct {
	ch    chan struct{}
	fired bool
}

func (w *waiter) fire() {
	if !w.fired {
		w.fired = true
		close(w.ch)
	}
}

// opKind is a command the writer sends.
type opKind int

const (
	opSubscribe opKind = iota
	opUnsubscribe
	opPing
)

type op struct {
	kind    opKind
	channel string
}

// subConn is one pub/sub connection of the hub. Its fields other than ps,
// kick, dropped, timer, opened and notBefore are guarded by the hub's mu.
type subConn struct {
	ps        *redis.PubSub
	kick      chan struct{} // wakes the writer; buffered (1)
	dropped   chan struct{} // closed when the connection is dropped
	timer     *time.Timer   // runs tick
	opened    time.Time
	notBefore time.Time // the writer sends nothing before

	queue    []op // commands not yet taken by the writer, in order
	dead     bool
	heard    bool      // something arrived on the connection
	awaiting int       // replies expected: one per channel (un)subscribed, one per PING
	since    time.Time // when the connection was last heard from, or awaiting last became positive
	timerAt  time.Time // when timer fires; zero when it is not armed
}

func newHub(client redis.UniversalClient) *hub {
	r := replyTimeout(client)
	return &hub{
		client:       client,
		replyTimeout: r,
		pingAfter:    r / 2,
		topics:       make(map[string]*topic),
	}
}

// watch registers a waiter on channel and returns once the channel's
// subscription is confirmed, with the waiter's channel and the function that
// removes it; or once ctx ends, or twice the reply timeout passed when ctx
// has no deadline, with an error.
func (h *hub) watch(ctx context.Context, channel string) (<-chan struct{}, func(), error) {
	if err := context.Cause(ctx); err != nil {
		return nil, nil, err
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, nil, idempotency.ErrStoreClosed
	}
	if h.conn == nil {
		h.conn = h.open()
	}
	tp := h.topics[channel]
	if tp == nil {
		tp = &topic{ready: make(chan struct{}), waiters: make(map[*waiter]struct{})}
		h.topics[channel] = tp
		h.sendLocked(h.conn, op{opSubscribe, channel})
	}
	w := &waiter{ch: make(chan struct{})}
	tp.refs++
	tp.waiters[w] = struct{}{}
	h.mu.Unlock()

	var once sync.Once
	stop := func() { once.Do(func() { h.leave(channel, tp, w) }) }

	var expired <-chan time.Time
	if _, ok := ctx.Deadline(); !ok {
		t := time.NewTimer(2 * h.replyTimeout)
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-tp.ready:
	case <-ctx.Done():
		stop()
		return nil, nil, context.Cause(ctx)
	case <-expired:
		stop()
		return nil, nil, fmt.Errorf("redisstore: subscription to %s not confirmed within %v", channel, 2*h.replyTimeout)
	}
	h.mu.Lock()
	err := tp.err
	h.mu.Unlock()
	if err != nil {
		stop()
		return nil, nil, err
	}
	return w.ch, stop, nil
}

// open starts a connection: its PubSub connects when the writer sends the
// first command, so on a Cluster it goes to the master of that command's
// first channel.
func (h *hub) open() *subConn {
	now := time.Now()
	c := &subConn{
		ps:        h.client.Subscribe(context.Background()),
		kick:      make(chan struct{}, 1),
		dropped:   make(chan struct{}),
		opened:    now,
		notBefore: h.retryAt,
		since:     now,
	}
	c.timer = time.AfterFunc(time.Hour, func() { h.tick(c) })
	c.timer.Stop()
	go h.write(c)
	return c
}

// leave removes w from tp and unsubscribes the channel when tp has no
// waiters left and its subscription is confirmed.
func (h *hub) leave(channel string, tp *topic, w *waiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(tp.waiters, w)
	tp.refs--
	if tp.refs == 0 && tp.confirmed && h.topics[channel] == tp {
		delete(h.topics, channel)
		h.sendLocked(h.conn, op{opUnsubscribe, channel})
	}
}

// sendLocked queues o for c's writer; its reply is due within the reply
// timeout of the time it can be sent.
func (h *hub) sendLocked(c *subConn, o op) {
	if c.awaiting == 0 {
		c.since = time.Now()
		if c.since.Before(c.notBefore) {
			c.since = c.notBefore
		}
	}
	c.awaiting++
	c.queue = append(c.queue, o)
	select {
	case c.kick <- struct{}{}:
	default:
	}
	h.armLocked(c)
}

// armLocked sets c's timer for the next tick: when the oldest reply
// awaited is due, else, while channels are subscribed, when a PING is. An
// idle connection has no timer running.
func (h *hub) armLocked(c *subConn) {
	var at time.Time
	switch {
	case c.awaiting > 0:
		at = c.since.Add(h.replyTimeout)
	case len(h.topics) > 0:
		at = c.since.Add(h.pingAfter)
	default:
		return
	}
	if c.timerAt.IsZero() || at.Before(c.timerAt) {
		c.timerAt = at
		c.timer.Reset(time.Until(at))
	}
}

// tick drops c when a reply is overdue and pings it when it has been
// silent for pingAfter with channels subscribed.
func (h *hub) tick(c *subConn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c.dead {
		return
	}
	c.timerAt = time.Time{}
	quiet := time.Since(c.since)
	switch {
	case c.awaiting > 0 && quiet >= h.replyTimeout:
		h.dropLocked(c, fmt.Errorf("redisstore: no reply on the pub/sub connection for %v", h.replyTimeout))
		return
	case c.awaiting == 0 && len(h.topics) > 0 && quiet >= h.pingAfter:
		h.sendLocked(c, op{kind: opPing})
	}
	h.armLocked(c)
}

// dropLocked closes c, which is the hub's connection unless already
// dropped. The waiters of confirmed subscriptions are woken (they re-check
// and watch again). Subscriptions still pending keep their waiters and
// move to a new connection, which sends nothing before pingAfter has passed
// since c was opened when nothing ever arrived on c (a node that refuses
// connections is not dialled in a loop). Once the hub is closed, pending
// subscriptions fail with err instead. The PubSub is closed in the
// background: a writer blocked on a node that does not answer holds it
// until go-redis gives up.
func (h *hub) dropLocked(c *subConn, err error) {
	if c.dead {
		return
	}
	c.dead = true
	c.queue = nil
	close(c.dropped)
	c.timer.Stop()
	go c.ps.Close()
	if h.conn != c {
		return
	}
	h.conn = nil
	if c.heard {
		h.retryAt = time.Time{}
	} else {
		h.retryAt = c.opened.Add(h.pingAfter)
	}
	pending := make(map[string]*topic)
	for channel, tp := range h.topics {
		switch {
		case tp.confirmed:
			for w := range tp.waiters {
				w.fire()
			}
		case tp.refs > 0 && !h.closed:
			pending[channel] = tp
		default:
			tp.err = err
			close(tp.ready)
		}
	}
	h.topics = pending
	if len(pending) > 0 {
		h.conn = h.open()
		for channel := range pending {
			h.sendLocked(h.conn, op{opSubscribe, channel})
		}
	}
}

// write sends c's queued commands in order, a run of subscribes (or of
// unsubscribes) as one command, and starts the reader once the first
// command is sent, so that on a Cluster the connection goes to the master
// of the first channel rather than to a random node. An error drops c.
func (h *hub) write(c *subConn) {
	if d := time.Until(c.notBefore); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-c.dropped:
			t.Stop()
			return
		}
	}
	reading := false
	for {
		select {
		case <-c.kick:
		case <-c.dropped:
			return
		}
		for {
			h.mu.Lock()
			if c.dead || len(c.queue) == 0 {
				h.mu.Unlock()
				break
			}
			kind := c.queue[0].kind
			n := 1
			for kind != opPing && n < len(c.queue) && c.queue[n].kind == kind {
				n++
			}
			channels := make([]string, 0, n)
			for _, o := range c.queue[:n] {
				if kind != opPing {
					channels = append(channels, o.channel)
				}
			}
			c.queue = c.queue[n:]
			h.mu.Unlock()

			ctx, cancel := context.WithTimeout(context.Background(), h.replyTimeout)
			var err error
			switch kind {
			case opSubscribe:
				err = c.ps.Subscribe(ctx, channels...)
			case opUnsubscribe:
				err = c.ps.Unsubscribe(ctx, channels...)
			case opPing:
				err = c.ps.Ping(ctx)
			}
			cancel()
			if err != nil {
				h.mu.Lock()
				h.dropLocked(c, fmt.Errorf("redisstore: pub/sub connection: %w", err))
				h.mu.Unlock()
				return
			}
			if !reading {
				reading = true
				go h.read(c)
			}
		}
	}
}

// repliedLocked counts a reply on c. When none is awaited any more, the
// next PING is due sooner than the reply the timer was set for.
func (h *hub) repliedLocked(c *subConn) {
	c.awaiting = max(c.awaiting-1, 0)
	if c.awaiting == 0 {
		h.armLocked(c)
	}
}

// read routes what arrives on c: confirmations to their topic, messages
// to the waiters of their channel. Whatever arrives shows that c is alive;
// an error drops it.
func (h *hub) read(c *subConn) {
	for {
		msg, err := c.ps.Receive(context.Background())
		h.mu.Lock()
		if c.dead {
			h.mu.Unlock()
			return
		}
		if err != nil {
			h.dropLocked(c, fmt.Errorf("redisstore: pub/sub connection: %w", err))
			h.mu.Unlock()
			return
		}
		c.heard = true
		c.since = time.Now()
		switch m := msg.(type) {
		case *redis.Subscription:
			h.repliedLocked(c)
			if m.Kind != "subscribe" {
				break
			}
			if tp := h.topics[m.Channel]; tp != nil && !tp.confirmed && tp.err == nil {
				tp.confirmed = true
				close(tp.ready)
				if tp.refs == 0 {
					delete(h.topics, m.Channel)
					h.sendLocked(c, op{opUnsubscribe, m.Channel})
				}
			}
		case *redis.Pong:
			h.repliedLocked(c)
		case *redis.Message:
			if tp := h.topics[m.Channel]; tp != nil {
				for w := range tp.waiters {
					w.fire()
				}
			}
		}
		h.mu.Unlock()
	}
}

// close drops the connection, waking every waiter; pending Watch calls fail
// with idempotency.ErrStoreClosed. It does not wait for Redis: the
// connection is closed in the background.
func (h *hub) close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil
	}
	h.closed = true
	if h.conn != nil {
		h.dropLocked(h.conn, idempotency.ErrStoreClosed)
	}
	return nil
}
