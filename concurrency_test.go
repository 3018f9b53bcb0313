package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

func newTestLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func post(t testing.TB, client *http.Client, url, key, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return nil, ""
	}
	req.Header.Set("Idempotency-Key", key)
	res, err := client.Do(req)
	if err != nil {
		t.Error(err)
		return nil, ""
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Error(err)
	}
	return res, string(b)
}

// TestConcurrentDuplicates sends 100 duplicates at once through a real HTTP
// server: the handler runs exactly once; without wait mode every other
// request gets 409 with Retry-After, with it every other request gets the
// replay.
func TestConcurrentDuplicates(t *testing.T) {
	const n = 100
	for _, wait := range []bool{false, true} {
		t.Run(map[bool]string{false: "409", true: "wait"}[wait], func(t *testing.T) {
			store := &failingStore{Store: newMemStore(t)}
			var runs atomic.Int64
			release := make(chan struct{})
			handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				<-release
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, "paid once")
			})
			opts := []idempotency.Option{}
			if wait {
				opts = append(opts, idempotency.WithWait(10*time.Second))
			}
			srv := httptest.NewServer(idempotency.New(store, opts...)(handler))
			defer srv.Close()
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
			defer client.CloseIdleConnections()

			var wg sync.WaitGroup
			var created, replayed, conflicts, other atomic.Int64
			var answered atomic.Int64
			allAnswered := make(chan struct{})
			start := make(chan struct{})
			for i := 0; i < n; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					res, body := post(t, client, srv.URL, "dup", "same")
					if res == nil {
						return
					}
					switch {
					case res.StatusCode == 201 && body == "paid once" && res.Header.Get("Idempotent-Replayed") == "true":
						replayed.Add(1)
					case res.StatusCode == 201 && body == "paid once":
						created.Add(1)
					case res.StatusCode == 409 && res.Header.Get("Retry-After") != "":
						conflicts.Add(1)
					default:
						other.Add(1)
						t.Errorf("unexpected answer %d %q", res.StatusCode, body)
					}
					if answered.Add(1) == n-1 {
						close(allAnswered)
					}
				}()
			}
			close(start)
			if wait {
				// Every duplicate has looked the record up (at least twice:
				// once on arrival, once after subscribing) before the
				// original finishes.
				deadline := time.Now().Add(10 * time.Second)
				for store.acquires.Load() < 2*n-1 && time.Now().Before(deadline) {
					time.Sleep(time.Millisecond)
				}
				close(release)
			} else {
				select {
				case <-allAnswered:
				case <-time.After(10 * time.Second):
					t.Error("the duplicates were not answered while the original ran")
				}
				close(release)
			}
			wg.Wait()
			if runs.Load() != 1 {
				t.Fatalf("handler ran %d times, want 1", runs.Load())
			}
			if created.Load() != 1 || other.Load() != 0 {
				t.Fatalf("created %d other %d", created.Load(), other.Load())
			}
			if wait && replayed.Load() != n-1 {
				t.Fatalf("replayed %d, want %d", replayed.Load(), n-1)
			}
			if !wait && conflicts.Load() != n-1 {
				t.Fatalf("conflicts %d, want %d", conflicts.Load(), n-1)
			}
		})
	}
}

// TestWaitTakesOverAfterRelease: a waiter whose original fails (5xx) runs
// the handler itself.
func TestWaitTakesOverAfterRelease(t *testing.T) {
	var runs atomic.Int64
	entered := make(chan struct{})
	release := make(chan struct{})
	store := &failingStore{Store: newMemStore(t)}
	h := idempotency.New(store, idempotency.WithWait(5*time.Second))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(entered)
			<-release
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	first := make(chan int)
	go func() { first <- do(h, http.MethodPost, "k", "").StatusCode }()
	<-entered
	second := make(chan int)
	go func() { second <- do(h, http.MethodPost, "k", "").StatusCode }()
	for store.acquires.Load() < 3 { // the waiter subscribed and re-checked
		time.Sleep(time.Millisecond)
	}
	close(release)
	if s := <-first; s != 503 {
		t.Fatalf("first: %d", s)
	}
	if s := <-second; s != 201 {
		t.Fatalf("waiter: %d, want 201 from its own execution", s)
	}
	if runs.Load() != 2 {
		t.Fatalf("runs %d, want 2", runs.Load())
	}
}

// TestWaitBound: a waiter gives up with 409 when the original outlasts the
// wait bound.
func TestWaitBound(t *testing.T) {
	entered := make(chan struct{})
	release := make(chan struct{})
	defer close(release)
	h := idempotency.New(newMemStore(t), idempotency.WithWait(50*time.Millisecond))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
	}))
	go do(h, http.MethodPost, "k", "")
	<-entered
	res := do(h, http.MethodPost, "k", "")
	if res.StatusCode != 409 || res.Header.Get("Retry-After") == "" {
		t.Fatalf("waiter past the bound: %d", res.StatusCode)
	}
}

// TestHandlerOutlivesLease: the heartbeat keeps a slow handler's lease, so a
// duplicate arriving after several lease periods is refused, not stolen.
func TestHandlerOutlivesLease(t *testing.T) {
	const lease = 150 * time.Millisecond
	var runs atomic.Int64
	entered := make(chan struct{})
	release := make(chan struct{})
	h := idempotency.New(newMemStore(t), idempotency.WithLease(lease))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		close(entered)
		<-release
		if err := r.Context().Err(); err != nil {
			t.Errorf("handler context cancelled although the heartbeat held the lease: %v", context.Cause(r.Context()))
		}
		w.WriteHeader(http.StatusCreated)
	}))
	done := make(chan int)
	go func() { done <- do(h, http.MethodPost, "k", "").StatusCode }()
	<-entered
	time.Sleep(4 * lease) // only real time lets the lease expire
	if res := do(h, http.MethodPost, "k", ""); res.StatusCode != 409 {
		t.Fatalf("duplicate after 4 leases: %d, want 409", res.StatusCode)
	}
	close(release)
	if s := <-done; s != 201 {
		t.Fatalf("original: %d", s)
	}
	if res := do(h, http.MethodPost, "k", ""); res.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("no replay after the slow handler completed")
	}
	if runs.Load() != 1 {
		t.Fatalf("runs %d", runs.Load())
	}
}

// beatCounter is a store that counts the extends of each record and those
// that come after the record was completed.
type beatCounter struct {
	idempotency.Store
	want   int           // records that must reach two extends
	enough chan struct{} // closed when they have

	mu        sync.Mutex
	extends   map[string]int
	completed map[string]bool
	reached   int
	late      int // extends of completed records
}

func (c *beatCounter) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	c.mu.Lock()
	c.extends[key]++
	if c.completed[key] {
		c.late++
	}
	if c.extends[key] == 2 {
		if c.reached++; c.reached == c.want {
			close(c.enough)
		}
	}
	c.mu.Unlock()
	return c.Store.Extend(ctx, key, token, lease)
}

func (c *beatCounter) Complete(ctx context.Context, key, token string, resp *idempotency.Response, ttl time.Duration) error {
	c.mu.Lock()
	c.completed[key] = true
	c.mu.Unlock()
	return c.Store.Complete(ctx, key, token, resp, ttl)
}

// TestHeartbeatsManyHandlers: the heartbeats of many handlers running at once
// on one middleware share one timer; each keeps its own lease (no handler's
// context is cancelled, no duplicate steals) and none beats after its
// handler returned.
func TestHeartbeatsManyHandlers(t *testing.T) {
	const n, lease = 32, 60 * time.Millisecond
	store := &beatCounter{
		Store: newMemStore(t), want: n, enough: make(chan struct{}),
		extends: map[string]int{}, completed: map[string]bool{},
	}
	var runs, cancelled atomic.Int64
	release := make(chan struct{})
	h := idempotency.New(store, idempotency.WithLease(lease))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		<-release
		if r.Context().Err() != nil {
			cancelled.Add(1)
		}
		w.WriteHeader(http.StatusCreated)
	}))
	statuses := make(chan int, n)
	for i := range n {
		go func() { statuses <- do(h, http.MethodPost, fmt.Sprint("k", i), "").StatusCode }()
	}
	select {
	case <-store.enough: // every record was extended twice: beyond its first lease
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatalf("only %d of %d records were extended twice", store.reached, n)
	}
	// A duplicate of each finds its record held, not expired.
	for i := range n {
		if res := do(h, http.MethodPost, fmt.Sprint("k", i), ""); res.StatusCode != http.StatusConflict {
			t.Errorf("duplicate of k%d: %d, want 409", i, res.StatusCode)
		}
	}
	close(release)
	for range n {
		if s := <-statuses; s != http.StatusCreated {
			t.Errorf("original: %d", s)
		}
	}
	if runs.Load() != n || cancelled.Load() != 0 {
		t.Fatalf("runs %d, cancelled contexts %d", runs.Load(), cancelled.Load())
	}
	time.Sleep(3 * lease) // only real time shows that no beat comes late
	store.mu.Lock()
	defer store.mu.Unlock()
	if store.late != 0 {
		t.Fatalf("%d extends after their record was completed", store.late)
	}
}

// TestLeaseLost: when the heartbeat cannot extend the lease, the handler's
// context is cancelled with a cause wrapping ErrLeaseLost before the lease
// runs out in the store (a duplicate right then still gets 409); once it has,
// a duplicate steals the record, and the stale owner's completion is
// refused, leaving the new owner's response stored.
func TestLeaseLost(t *testing.T) {
	const lease = 300 * time.Millisecond
	store := &failingStore{Store: newMemStore(t)}
	unreachable := errors.New("extend: connection reset")
	store.extendErr.Store(&unreachable)

	var mu sync.Mutex
	var kinds []idempotency.EventKind
	obs := idempotency.WithObserver(func(_ context.Context, e idempotency.Event) {
		mu.Lock()
		kinds = append(kinds, e.Kind)
		mu.Unlock()
	})
	var runs atomic.Int64
	cause := make(chan error, 1)
	stolen := make(chan struct{})
	h := idempotency.New(store, idempotency.WithLease(lease), obs)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			<-r.Context().Done()
			cause <- context.Cause(r.Context())
			<-stolen
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "stale owner")
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "new owner")
	}))
	done := make(chan string)
	go func() { done <- readAll(t, do(h, http.MethodPost, "k", "")) }()
	select {
	case err := <-cause:
		if !errors.Is(err, idempotency.ErrLeaseLost) {
			t.Fatalf("cause %v, want ErrLeaseLost", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the handler's context was not cancelled")
	}
	// Cancelled before the store's lease ran out: nobody can steal yet.
	if res := do(h, http.MethodPost, "k", ""); res.StatusCode != http.StatusConflict {
		t.Fatalf("duplicate right after the cancellation: %d, want 409", res.StatusCode)
	}
	// Once the lease has run out, a duplicate steals it and runs.
	res := do(h, http.MethodPost, "k", "")
	for deadline := time.Now().Add(5 * time.Second); res.StatusCode == http.StatusConflict && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond) // only real time ends the lease
		res = do(h, http.MethodPost, "k", "")
	}
	if body := readAll(t, res); res.StatusCode != 201 || body != "new owner" {
		t.Fatalf("stealer got %d %q", res.StatusCode, body)
	}
	close(stolen)
	if body := <-done; body != "stale owner" {
		t.Fatalf("stale owner's client got %q", body)
	}
	res = do(h, http.MethodPost, "k", "")
	if body := readAll(t, res); body != "new owner" || res.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("stored response %q: the stale owner overwrote the new owner", body)
	}
	mu.Lock()
	defer mu.Unlock()
	count := map[idempotency.EventKind]int{}
	for _, k := range kinds {
		count[k]++
	}
	if count[idempotency.EventLeaseLost] != 1 || count[idempotency.EventStolen] != 1 || count[idempotency.EventExecuted] != 1 {
		t.Fatalf("events %v", kinds)
	}
}

// TestFlushPassesThrough: a streaming handler's first chunk reaches the
// client before the handler returns, and the whole stream is replayed.
func TestFlushPassesThrough(t *testing.T) {
	firstRead := make(chan struct{})
	h := idempotency.New(newMemStore(t))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "chunk1;")
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("flush: %v", err)
		}
		select {
		case <-firstRead:
		case <-time.After(5 * time.Second):
			t.Error("the first chunk did not reach the client before the handler returned")
		}
		io.WriteString(w, "chunk2")
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL, nil)
	req.Header.Set("Idempotency-Key", "stream")
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len("chunk1;"))
	if _, err := io.ReadFull(res.Body, buf); err != nil || string(buf) != "chunk1;" {
		t.Fatalf("first chunk %q %v", buf, err)
	}
	close(firstRead)
	rest, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if string(rest) != "chunk2" {
		t.Fatalf("rest %q", rest)
	}
	_, body := post(t, srv.Client(), srv.URL, "stream", "")
	if body != "chunk1;chunk2" {
		t.Fatalf("replay %q", body)
	}
}

// TestClientGoneCancelsHandler: over a real server, a client that goes
// away cancels the handler's context, whether the handler waits on it from
// the start or only looks at it later.
func TestClientGoneCancelsHandler(t *testing.T) {
	for _, waitFirst := range []bool{true, false} {
		started := make(chan struct{})
		gone := make(chan error, 1)
		h := idempotency.New(newMemStore(t))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx := r.Context()
			if waitFirst {
				done := ctx.Done()
				close(started)
				select {
				case <-done:
				case <-time.After(10 * time.Second):
				}
			} else {
				close(started)
				deadline := time.Now().Add(10 * time.Second)
				for ctx.Err() == nil && time.Now().Before(deadline) {
					time.Sleep(time.Millisecond) // polls, as a loop over work items would
				}
			}
			gone <- context.Cause(ctx)
		}))
		srv := httptest.NewServer(h)
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
		req.Header.Set("Idempotency-Key", "gone")
		errc := make(chan error, 1)
		go func() {
			res, err := srv.Client().Do(req)
			if err == nil {
				res.Body.Close()
			}
			errc <- err
		}()
		<-started
		cancel()
		if err := <-errc; err == nil {
			t.Errorf("waitFirst=%v: the cancelled request succeeded", waitFirst)
		}
		if err := <-gone; !errors.Is(err, context.Canceled) {
			t.Errorf("waitFirst=%v: handler saw %v, want context.Canceled", waitFirst, err)
		}
		srv.Close()
	}
}
