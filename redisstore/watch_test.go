package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/redisstore"
	"github.com/redis/go-redis/v9"
)

func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: not notified", what)
	}
}

func TestWatchWakesOnCompleteAndRelease(t *testing.T) {
	s := newStore(t, newClient(t))
	for _, edge := range []string{"complete", "release"} {
		key := randKey()
		mustAcquire(t, s, req(key, "t1"), idempotency.Acquired)
		changed, stop, err := s.Watch(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-changed:
			t.Fatalf("%s: notified before anything changed", edge)
		default:
		}
		if err := runEdge(s, edge, key, "t1"); err != nil {
			t.Fatal(err)
		}
		// No sleep between Watch and the edge: Watch returned after the
		// subscription was confirmed, so the message cannot be missed.
		waitClosed(t, changed, edge)
		stop()
	}
}

func TestWatchOnlyItsKey(t *testing.T) {
	s := newStore(t, newClient(t))
	a, b := randKey(), randKey()
	mustAcquire(t, s, req(a, "t1"), idempotency.Acquired)
	mustAcquire(t, s, req(b, "t1"), idempotency.Acquired)
	chA, stopA, err := s.Watch(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	defer stopA()
	chB, stopB, err := s.Watch(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	defer stopB()
	if err := s.Release(ctx, b, "t1"); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, chB, "b")
	// b's message has been dispatched; a's waiter must still be waiting.
	// Release a and check it fires only then.
	select {
	case <-chA:
		t.Fatal("a notified by b's release")
	default:
	}
	if err := s.Release(ctx, a, "t1"); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, chA, "a")
}

// pubsubConns counts the server's connections named name that hold a
// channel subscription.
func pubsubConns(t *testing.T, c *redis.Client, name string) int {
	t.Helper()
	list, err := c.ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	count := 0
	for _, line := range strings.Split(list, "\n") {
		fields := strings.Fields(line)
		if !slices.Contains(fields, "name="+name) {
			continue
		}
		for _, f := range fields {
			if v, ok := strings.CutPrefix(f, "sub="); ok && v != "0" {
				count++
			}
		}
	}
	return count
}

// TestWatchSharesOneConnection: many waiters on many keys use one pub/sub
// connection, and a channel stays subscribed while any waiter needs it.
func TestWatchSharesOneConnection(t *testing.T) {
	name := strings.TrimSuffix(strings.ReplaceAll(redistest.Prefix(), ":", "-"), "-")
	c := redis.NewClient(&redis.Options{Addr: redistest.Addr(t), ClientName: name})
	t.Cleanup(func() { c.Close() })
	s := newStore(t, c)
	const keys, perKey = 20, 5
	var names []string
	type w struct {
		key  string
		ch   <-chan struct{}
		stop func()
	}
	var ws []w
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := 0; i < keys; i++ {
		key := randKey()
		names = append(names, key)
		mustAcquire(t, s, req(key, "t1"), idempotency.Acquired)
		for j := 0; j < perKey; j++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ch, stop, err := s.Watch(ctx, key)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				ws = append(ws, w{key, ch, stop})
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if n := pubsubConns(t, c, name); n != 1 {
		t.Fatalf("%d pub/sub connections for %d waiters, want 1", n, keys*perKey)
	}
	numsub, err := c.PubSubNumSub(ctx, s.Channel(names[0])).Result()
	if err != nil || numsub[s.Channel(names[0])] != 1 {
		t.Fatalf("NUMSUB = %v, %v; want 1 subscription for 5 waiters", numsub, err)
	}
	// Stop all but one waiter of key 0: the channel stays subscribed and
	// the remaining waiter is still notified.
	var keep w
	kept := false
	for _, x := range ws {
		if x.key == names[0] && !kept {
			keep, kept = x, true
			continue
		}
		x.stop()
	}
	if err := s.Release(ctx, names[0], "t1"); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, keep.ch, "remaining waiter")
	keep.stop()
	// With every waiter gone, every channel is unsubscribed.
	if !waitUntil(5*time.Second, func() bool {
		for _, k := range names {
			n, err := c.PubSubNumSub(ctx, s.Channel(k)).Result()
			if err != nil || n[s.Channel(k)] != 0 {
				return false
			}
		}
		return true
	}) {
		t.Fatal("channels still subscribed after every waiter stopped")
	}
}

// TestWatchChurn: waiters come and go on the same few channels from many
// goroutines, while completions happen; every waiter registered before a
// completion is notified.
func TestWatchChurn(t *testing.T) {
	s := newStore(t, newClient(t))
	const goroutines, rounds = 16, 20
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				key := randKey()
				tok := "t" + strconv.Itoa(g)
				if _, err := s.Acquire(ctx, req(key, tok)); err != nil {
					t.Error(err)
					return
				}
				ch, stop, err := s.Watch(ctx, key)
				if err != nil {
					t.Error(err)
					return
				}
				// Subscribe and unsubscribe a neighbour channel too.
				_, stop2, err := s.Watch(ctx, key[:10])
				if err != nil {
					t.Error(err)
					stop()
					return
				}
				stop2()
				if err := s.Complete(ctx, key, tok, sampleResponse(), time.Minute); err != nil {
					t.Error(err)
				}
				select {
				case <-ch:
				case <-time.After(5 * time.Second):
					t.Errorf("goroutine %d round %d: completion not notified", g, r)
				}
				stop()
			}
		}(g)
	}
	wg.Wait()
}

func TestWatchContextCancelled(t *testing.T) {
	s := newStore(t, newClient(t))
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, _, err := s.Watch(cctx, randKey())
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Watch with a cancelled context = %v", err)
	}
	// The store still works for other waiters.
	key := randKey()
	mustAcquire(t, s, req(key, "t1"), idempotency.Acquired)
	ch, stop, err := s.Watch(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if err := s.Release(ctx, key, "t1"); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, ch, "after a cancelled Watch")
}

// runEdge completes (edge "complete") or releases the record at key held
// by token.
func runEdge(s *redisstore.Store, edge, key, token string) error {
	if edge == "complete" {
		return s.Complete(ctx, key, token, sampleResponse(), time.Hour)
	}
	return s.Release(ctx, key, token)
}

func waitUntil(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// TestPublishOnlyWhenWatched: complete and release publish on a record's
// channel only when a waiter has watched the record. A subscriber of its own
// (not the store's) listens on each channel; after each edge it sends a
// PING on the same connection, so a message the edge published arrives
// before the PONG and a missing one is known without waiting.
func TestPublishOnlyWhenWatched(t *testing.T) {
	c := newClient(t)
	s := newStore(t, c)
	published := func(t *testing.T, ps *redis.PubSub) []string {
		t.Helper()
		if err := ps.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		var got []string
		for {
			msg, err := ps.ReceiveTimeout(ctx, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			switch m := msg.(type) {
			case *redis.Message:
				got = append(got, m.Payload)
			case *redis.Pong:
				return got
			}
		}
	}
	for _, edge := range []string{"complete", "release"} {
		for _, watched := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/watched=%v", edge, watched), func(t *testing.T) {
				key := randKey()
				ps := c.Subscribe(ctx, s.Channel(key))
				defer ps.Close()
				if _, err := ps.ReceiveTimeout(ctx, 5*time.Second); err != nil { // the confirmation
					t.Fatal(err)
				}
				mustAcquire(t, s, req(key, "t1"), idempotency.Acquired)
				var changed <-chan struct{}
				if watched {
					ch, stop, err := s.Watch(ctx, key)
					if err != nil {
						t.Fatal(err)
					}
					defer stop()
					changed = ch
					if h := c.HGet(ctx, s.RecordKey(key), "h").Val(); !isWatched(c, s.RecordKey(key)) {
						t.Fatalf("head after Watch = %q, want state P (watched)", h)
					}
				}
				if err := runEdge(s, edge, key, "t1"); err != nil {
					t.Fatal(err)
				}
				got := published(t, ps)
				want := map[string]string{"complete": "complete", "release": "released"}[edge]
				switch {
				case watched && !slices.Equal(got, []string{want}):
					t.Fatalf("published %q, want [%q]", got, want)
				case !watched && len(got) != 0:
					t.Fatalf("published %q with no waiter, want nothing", got)
				}
				if watched {
					waitClosed(t, changed, edge)
				}
			})
		}
	}
}

// TestWatchMarksOnlyRecords: Watch on a key with no record creates
// nothing, and on a value that is not a hash reports a corrupt record.
func TestWatchMarksOnlyRecords(t *testing.T) {
	c := newClient(t)
	s := newStore(t, c)
	key := randKey()
	_, stop, err := s.Watch(ctx, key)
	if err != nil {
		t.Fatalf("Watch of a free key: %v", err)
	}
	stop()
	if n := c.Exists(ctx, s.RecordKey(key)).Val(); n != 0 {
		t.Fatalf("Watch of a free key created it: %v", c.HGetAll(ctx, s.RecordKey(key)).Val())
	}
	// The key is free for a first execution, which nothing marked.
	mustAcquire(t, s, req(key, "t1"), idempotency.Acquired)
	if isWatched(c, s.RecordKey(key)) {
		t.Fatal("a record watched before it existed is marked")
	}

	bad := randKey()
	if err := c.Set(ctx, s.RecordKey(bad), "not a hash", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Watch(ctx, bad); !errors.Is(err, idempotency.ErrCorruptRecord) {
		t.Fatalf("Watch of a string = %v, want ErrCorruptRecord", err)
	}
	// A failed Watch leaves no subscription behind.
	if !waitUntil(5*time.Second, func() bool {
		n, err := c.PubSubNumSub(ctx, s.Channel(bad)).Result()
		return err == nil && n[s.Channel(bad)] == 0
	}) {
		t.Fatal("channel still subscribed after a failed Watch")
	}
}

// TestWatchPingsOnlyWhileSubscribed: the store pings its pub/sub
// connection after half a reply timeout (the client's ReadTimeout) of
// silence while a channel is subscribed, and not at all once none is.
func TestWatchPingsOnlyWhileSubscribed(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { c.Close() })
	s := newStore(t, c)
	pings := func() int { return redistest.CommandCalls(t, srv.Addr(), "ping") }
	key := randKey()
	_, stop, err := s.Watch(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	before := pings()
	time.Sleep(time.Second)
	if n := pings() - before; n < 3 {
		t.Errorf("%d PINGs in 1s with a channel subscribed, want one per 100ms of silence", n)
	}
	stop()
	if !waitUntil(5*time.Second, func() bool {
		n, err := c.PubSubNumSub(ctx, s.Channel(key)).Result()
		return err == nil && n[s.Channel(key)] == 0
	}) {
		t.Fatal("channel still subscribed")
	}
	before = pings()
	time.Sleep(time.Second)
	if n := pings() - before; n != 0 {
		t.Errorf("%d PINGs in 1s with no channel subscribed, want none", n)
	}
}

// TestWatchRedialPaced: while the server refuses connections, a Watch
// waiting for its subscription is carried from one new connection to the
// next, at most one per half reply timeout rather than in a loop, and
// returns by its deadline; once the server is back, its subscription is
// confirmed.
func TestWatchRedialPaced(t *testing.T) {
	srv := redistest.Start(t)
	var dials atomic.Int64
	c := redis.NewClient(&redis.Options{
		Addr:        srv.Addr(),
		ReadTimeout: 200 * time.Millisecond, // a new connection at most every 100ms
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	})
	t.Cleanup(func() { c.Close() })
	s := newStore(t, c)
	key := randKey()
	mustAcquire(t, s, req(key, "t1"), idempotency.Acquired)
	_, stop, err := s.Watch(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	stop()

	srv.Stop()
	before := dials.Load()
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, _, err := s.Watch(wctx, randKey()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Watch with the server down = %v, want the context's deadline", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Watch with a 1s deadline returned after %v", took)
	}
	n := dials.Load() - before
	t.Logf("%d dials in the second the server was down", n)
	if n > 40 { // go-redis dials up to twice per connection
		t.Errorf("%d dials in the second the server was down, want about 20", n)
	}

	// A Watch that starts while the server is down is confirmed once it
	// is back.
	key2 := randKey()
	done := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, stop, err := s.Watch(wctx, key2)
		if err == nil {
			stop()
		}
		done <- err
	}()
	srv.Restart()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Watch made while the server was down: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Watch made while the server was down did not return")
	}
}

// TestWatchOfFreeKeyThenInFlight: a waiter that watched the key while it
// was free (nothing to mark) and then finds another request's new record in
// flight is woken by that record's completion: the in-flight acquire marks
// the record as watched.
func TestWatchOfFreeKeyThenInFlight(t *testing.T) {
	s := newStore(t, newClient(t))
	key := randKey()
	changed, stop, err := s.Watch(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	mustAcquire(t, s, req(key, "holder"), idempotency.Acquired)
	mustAcquire(t, s, req(key, "waiter"), idempotency.InFlight)
	if err := s.Complete(ctx, key, "holder", sampleResponse(), time.Hour); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-time.After(3 * time.Second):
		t.Fatal("the waiter was not woken by the completion of the record it found in flight")
	}
}
