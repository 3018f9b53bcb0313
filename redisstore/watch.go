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
// All waiters of a Store share one pub/sub connection, opened on the first
// Watch: a channel is subscribed while at least one waiter watches it. When
// that connection breaks, every waiter is woken (a spurious wake-up only
// costs a re-check) and the subscriptions are restored on a new connection;
// a notification sent while it was down is lost, which is why waiters bound
// their wait.
func (s *Store) Watch(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if s.closed.Load() {
		return nil, nil, idempotency.ErrStoreClosed
	}
	if key == "" {
		return nil, nil, errors.New("redisstore: empty key")
	}
	rkey, channel := s.keyAndChannel(key)
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

// mark runs the watch script on the record at rkey.
func (s *Store) mark(ctx context.Context, rkey string) error {
	reply, err := watchScript.Run(ctx, s.client, []string{rkey}).Slice()
	if err != nil {
		return fmt.Errorf("redisstore: watch %s: %w", rkey, err)
	}
	code, err := replyCode(rkey, reply)
	if err == nil && code != 0 && code != 1 {
		err = fmt.Errorf("redisstore: watch %s: unexpected reply %v", rkey, reply)
	}
	return err
}

// hub multiplexes the waiters of one Store over a single *redis.PubSub. A
// dispatcher goroutine reads the connection and routes messages to the
// waiters of their channel.
//
// Each channel has at most one SUBSCRIBE in flight: a topic stays in the map
// until its subscription is confirmed, even when its last waiter left, and
// is unsubscribed only then. So the next confirmation for a channel always
// belongs to the topic in the map.
type hub struct {
	client redis.UniversalClient

	mu     sync.Mutex
	ps     *redis.PubSub
	topics map[string]*topic
	closed bool
	stop   chan struct{} // closed by close
	done   chan struct{} // closed when the dispatcher has returned
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

func newHub(client redis.UniversalClient) *hub {
	return &hub{
		client: client,
		topics: make(map[string]*topic),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
}

func (h *hub) watch(ctx context.Context, channel string) (<-chan struct{}, func(), error) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, nil, idempotency.ErrStoreClosed
	}
	startDispatcher := false
	if h.ps == nil {
		h.ps = h.client.Subscribe(context.Background())
		startDispatcher = true
	}
	tp := h.topics[channel]
	if tp == nil {
		tp = &topic{ready: make(chan struct{}), waiters: make(map[*waiter]struct{})}
		h.topics[channel] = tp
		if err := h.ps.Subscribe(ctx, channel); err != nil {
			// The connection could not be written to. Forget the
			// channel; go-redis would otherwise resubscribe it.
			h.failLocked(channel, tp, err)
		}
	}
	w := &waiter{ch: make(chan struct{})}
	tp.refs++
	tp.waiters[w] = struct{}{}
	if startDispatcher {
		go h.dispatch(h.ps)
	}
	h.mu.Unlock()

	var once sync.Once
	stop := func() { once.Do(func() { h.leave(channel, tp, w) }) }

	select {
	case <-tp.ready:
	case <-ctx.Done():
		stop()
		return nil, nil, context.Cause(ctx)
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

// leave removes w from tp and unsubscribes the channel when tp has no
// waiters left and its subscription is confirmed.
func (h *hub) leave(channel string, tp *topic, w *waiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(tp.waiters, w)
	tp.refs--
	if tp.refs == 0 && tp.confirmed && h.topics[channel] == tp {
		delete(h.topics, channel)
		if !h.closed {
			_ = h.ps.Unsubscribe(context.Background(), channel)
		}
	}
}

// failLocked ends the pending subscription tp with err.
func (h *hub) failLocked(channel string, tp *topic, err error) {
	if tp.confirmed || tp.err != nil {
		return
	}
	tp.err = err
	close(tp.ready)
	if h.topics[channel] == tp {
		delete(h.topics, channel)
		if !h.closed {
			_ = h.ps.Unsubscribe(context.Background(), channel)
		}
	}
}

func (h *hub) dispatch(ps *redis.PubSub) {
	defer close(h.done)
	backoff := time.Duration(0)
	for {
		msg, err := ps.Receive(context.Background())
		if err != nil {
			h.mu.Lock()
			if h.closed {
				h.mu.Unlock()
				return
			}
			// The connection broke (go-redis reconnects and
			// resubscribes). Notifications may have been lost: wake
			// every waiter, and fail subscriptions not yet confirmed.
			for channel, tp := range h.topics {
				for w := range tp.waiters {
					w.fire()
				}
				h.failLocked(channel, tp, err)
			}
			h.mu.Unlock()
			backoff = min(max(2*backoff, 10*time.Millisecond), time.Second)
			select {
			case <-h.stop:
				return
			case <-time.After(backoff):
			}
			continue
		}
		backoff = 0
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind != "subscribe" {
				continue
			}
			h.mu.Lock()
			if tp := h.topics[m.Channel]; tp != nil && !tp.confirmed && tp.err == nil {
				tp.confirmed = true
				close(tp.ready)
				if tp.refs == 0 {
					delete(h.topics, m.Channel)
					_ = ps.Unsubscribe(context.Background(), m.Channel)
				}
			}
			h.mu.Unlock()
		case *redis.Message:
			h.mu.Lock()
			if tp := h.topics[m.Channel]; tp != nil {
				for w := range tp.waiters {
					w.fire()
				}
			}
			h.mu.Unlock()
		}
	}
}

// close stops the dispatcher, closes the pub/sub connection and wakes every
// waiter; pending Watch calls fail with idempotency.ErrStoreClosed.
func (h *hub) close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	close(h.stop)
	for channel, tp := range h.topics {
		for w := range tp.waiters {
			w.fire()
		}
		h.failLocked(channel, tp, idempotency.ErrStoreClosed)
	}
	ps := h.ps
	h.mu.Unlock()
	if ps == nil {
		return nil
	}
	err := ps.Close()
	<-h.done
	return err
}
