package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/memstore"
)

// payServer is a payments endpoint behind the real middleware on a memstore.
type payServer struct {
	srv      *httptest.Server
	executed atomic.Int64
	// gate, when set, is received from by the first execution before it
	// answers, holding the key IN_PROGRESS.
	gate    chan struct{}
	started chan struct{}
	// completed receives an event each time a response is stored.
	completed chan struct{}
	conflicts atomic.Int64 // 409s answered
	// drop, when set, decides per request whether to lose its answer after
	// the whole middleware chain ran.
	drop func(r *http.Request) bool
	// hold, when set, is called by every execution before it answers.
	hold func(r *http.Request)
	// observe, when set, sees every middleware event.
	observe func(idempotency.Event)

	mu     sync.Mutex
	bodies []string // answers produced by executions, in order
}

func newPayServer(t *testing.T, configure func(*payServer), opts ...idempotency.Option) *payServer {
	t.Helper()
	ps := &payServer{completed: make(chan struct{}, 1000), started: make(chan struct{}, 1000)}
	if configure != nil {
		configure(ps)
	}
	store := memstore.New()
	t.Cleanup(func() { store.Close() })
	opts = append([]idempotency.Option{
		idempotency.WithObserver(func(_ context.Context, e idempotency.Event) {
			switch e.Kind {
			case idempotency.EventExecuted:
				ps.completed <- struct{}{}
			case idempotency.EventConflict:
				ps.conflicts.Add(1)
			}
			if ps.observe != nil {
				ps.observe(e)
			}
		}),
	}, opts...)
	mw := idempotency.New(store, opts...)
	app := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		n := ps.executed.Add(1)
		ps.started <- struct{}{}
		if ps.gate != nil && n == 1 {
			<-ps.gate
		}
		if ps.hold != nil {
			ps.hold(r)
		}
		answer := fmt.Sprintf(`{"id":"pay_%d","request":%q}`, n, body)
		ps.mu.Lock()
		ps.bodies = append(ps.bodies, answer)
		ps.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, answer)
	}))
	ps.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ps.drop == nil || !ps.drop(r) {
			app.ServeHTTP(w, r)
			return
		}
		// Run the whole chain, then lose the answer on the way back.
		app.ServeHTTP(httptest.NewRecorder(), r)
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		conn.Close()
	}))
	t.Cleanup(ps.srv.Close)
	return ps
}

// dropFirst loses the answers of the first n requests.
func dropFirst(n int) func(*http.Request) bool {
	var seen atomic.Int64
	return func(*http.Request) bool { return seen.Add(1) <= int64(n) }
}

func (ps *payServer) answers() []string {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return append([]string(nil), ps.bodies...)
}

func TestMiddlewareLostAnswersAreReplayed(t *testing.T) {
	for _, n := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("%d lost", n), func(t *testing.T) {
			ps := newPayServer(t, func(ps *payServer) { ps.drop = dropFirst(n) })
			tr := newTestTransport(nil, newFakeClock())
			resp, err := tr.RoundTrip(post(t, context.Background(), ps.srv.URL, `{"amount":1234}`))
			if err != nil {
				t.Fatal(err)
			}
			body := readBody(t, resp)
			if resp.StatusCode != 201 || !Replayed(resp) {
				t.Errorf("got %d replayed=%v, want a replayed 201", resp.StatusCode, Replayed(resp))
			}
			if got := ps.executed.Load(); got != 1 {
				t.Errorf("handler ran %d times, want 1", got)
			}
			if Attempts(resp) != n+1 {
				t.Errorf("Attempts = %d, want %d", Attempts(resp), n+1)
			}
			if a := ps.answers(); len(a) != 1 || body != a[0] {
				t.Errorf("body %q, want the first execution's %q", body, a)
			}
		})
	}
}

func TestMiddlewareConflictThenReplay(t *testing.T) {
	ps := newPayServer(t, func(ps *payServer) { ps.gate = make(chan struct{}) })
	const key = "order-42"

	// The original request holds the key while its handler is gated.
	firstDone := make(chan string, 1)
	go func() {
		req := post(t, context.Background(), ps.srv.URL, "pay")
		req.Header.Set(HeaderKey, key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			firstDone <- ""
			return
		}
		firstDone <- readBody(t, resp)
	}()
	<-ps.started

	clock := newFakeClock()
	tr := newTestTransport(nil, clock)
	var sleeps atomic.Int64
	tr.sleep = func(ctx context.Context, d time.Duration) error {
		if sleeps.Add(1) == 1 {
			// The duplicate got 409; let the original finish and be stored.
			close(ps.gate)
			<-ps.completed
		}
		return clock.sleep(ctx, d)
	}
	req := post(t, context.Background(), ps.srv.URL, "pay")
	req.Header.Set(HeaderKey, key)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	if resp.StatusCode != 201 || !Replayed(resp) || Attempts(resp) != 2 {
		t.Errorf("got %d replayed=%v after %d attempts; want a replayed 201 after 2", resp.StatusCode, Replayed(resp), Attempts(resp))
	}
	if d := clock.delays(); len(d) != 1 || d[0] < time.Second {
		t.Errorf("delays %v, want one wait honouring Retry-After", d)
	}
	if first := <-firstDone; first != body {
		t.Errorf("replay %q differs from the original answer %q", body, first)
	}
	if ps.executed.Load() != 1 {
		t.Errorf("handler ran %d times", ps.executed.Load())
	}
}

func TestMiddlewareClientErrorsAreNotRetried(t *testing.T) {
	ps := newPayServer(t, nil, idempotency.WithMaxRequestBody(64))
	tr := newTestTransport(nil, newFakeClock())

	send := func(key, body string) *http.Response {
		t.Helper()
		req := post(t, context.Background(), ps.srv.URL, body)
		if key != "" {
			req.Header.Set(HeaderKey, key)
		}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		readBody(t, resp)
		return resp
	}
	if resp := send("k1", "first"); resp.StatusCode != 201 {
		t.Fatalf("first: %d", resp.StatusCode)
	}
	for _, tc := range []struct {
		name, key, body string
		want            int
	}{
		{"key reused with another body", "k1", "second", 422},
		{"key too long", strings.Repeat("k", 300), "x", 400},
		{"body too large", "k2", strings.Repeat("x", 100), 413},
	} {
		resp := send(tc.key, tc.body)
		if resp.StatusCode != tc.want || Attempts(resp) != 1 {
			t.Errorf("%s: %d after %d attempts, want %d after 1", tc.name, resp.StatusCode, Attempts(resp), tc.want)
		}
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/problem+json") {
			t.Errorf("%s: Content-Type %q", tc.name, ct)
		}
	}
	if ps.executed.Load() != 1 {
		t.Errorf("handler ran %d times, want 1", ps.executed.Load())
	}
}

func TestMiddlewareBodyNotRewindable(t *testing.T) {
	ps := newPayServer(t, func(ps *payServer) { ps.drop = dropFirst(1) })
	tr := newTestTransport(nil, newFakeClock())
	req, _ := http.NewRequest(http.MethodPost, ps.srv.URL, &onceReader{Reader: strings.NewReader("pay")})
	info := &Info{}
	req = req.WithContext(WithInfo(req.Context(), info))
	resp, err := tr.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
		t.Fatal("want an error")
	}
	if !errors.Is(err, ErrBodyNotRewindable) {
		t.Errorf("err = %v, want ErrBodyNotRewindable", err)
	}
	// The first attempt ran; its key tells the caller what to retry with.
	if ps.executed.Load() != 1 || info.Attempts != 1 || info.Key == "" {
		t.Errorf("executed %d, info %+v", ps.executed.Load(), info)
	}
}

// holdKey starts a request with key that holds it IN_PROGRESS until the test
// ends.
func holdKey(t *testing.T, ps *payServer, key string) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		req := post(t, context.Background(), ps.srv.URL, "pay")
		req.Header.Set(HeaderKey, key)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			readBody(t, resp)
		}
	}()
	<-ps.started
	t.Cleanup(func() {
		close(ps.gate)
		<-done
	})
}

func TestMiddlewareCancelDuringBackoff(t *testing.T) {
	ps := newPayServer(t, func(ps *payServer) { ps.gate = make(chan struct{}) })
	holdKey(t, ps, "k")

	tr := NewTransport(nil)
	waiting := make(chan time.Duration, 1)
	tr.sleep = func(ctx context.Context, d time.Duration) error {
		waiting <- d
		return sleepContext(ctx, d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var d time.Duration
	go func() {
		d = <-waiting
		cancel()
	}()
	req := post(t, ctx, ps.srv.URL, "pay")
	req.Header.Set(HeaderKey, "k")
	start := time.Now()
	resp, err := tr.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
	}
	elapsed := time.Since(start)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if d < time.Second || elapsed >= d {
		t.Errorf("returned after %v of a %v wait, want promptly", elapsed, d)
	}
}

func TestMiddlewareMaxAttemptsAndElapsed(t *testing.T) {
	ps := newPayServer(t, func(ps *payServer) { ps.gate = make(chan struct{}) }, idempotency.WithLease(10*time.Second))
	holdKey(t, ps, "k")

	send := func(tr *Transport) *http.Response {
		t.Helper()
		req := post(t, context.Background(), ps.srv.URL, "pay")
		req.Header.Set(HeaderKey, "k")
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		readBody(t, resp)
		if resp.StatusCode != 409 || Replayed(resp) {
			t.Fatalf("got %d, want the 409", resp.StatusCode)
		}
		return resp
	}
	t.Run("attempts", func(t *testing.T) {
		resp := send(newTestTransport(nil, newFakeClock(), WithMaxAttempts(3), WithMaxElapsed(time.Hour)))
		if Attempts(resp) != 3 {
			t.Errorf("Attempts = %d, want 3", Attempts(resp))
		}
	})
	t.Run("elapsed", func(t *testing.T) {
		// A 409 says Retry-After: 1; two waits fit in 2.5s, three do not.
		clock := newFakeClock()
		resp := send(newTestTransport(nil, clock, WithMaxAttempts(100), WithMaxElapsed(2500*time.Millisecond)))
		if Attempts(resp) != 3 || len(clock.delays()) != 2 {
			t.Errorf("Attempts = %d after waits %v, want 3 after 2", Attempts(resp), clock.delays())
		}
	})
	t.Run("Retry-After beyond budget", func(t *testing.T) {
		clock := newFakeClock()
		resp := send(newTestTransport(nil, clock, WithMaxElapsed(500*time.Millisecond)))
		if Attempts(resp) != 1 || len(clock.delays()) != 0 {
			t.Errorf("Attempts = %d after waits %v, want 1 at once", Attempts(resp), clock.delays())
		}
	})
	if ps.executed.Load() != 1 {
		t.Errorf("handler ran %d times", ps.executed.Load())
	}
}

func TestMiddlewareConcurrentClients(t *testing.T) {
	// Two goroutines send each key. Whichever executes first holds the key
	// until the other has met it in flight (409), and its answer is lost
	// when it is the key's first request: both must end with the one
	// stored answer.
	const keys, perKey = 24, 2
	var mu sync.Mutex
	firstSeen := map[string]bool{}
	arrived := map[string]int{}              // requests per key that reached the server
	conflicted := map[string]chan struct{}{} // by storage key
	for k := range keys {
		conflicted[idempotency.StorageKey("", fmt.Sprintf("key-%d", k))] = make(chan struct{})
	}
	ps := newPayServer(t, func(ps *payServer) {
		ps.drop = func(r *http.Request) bool {
			mu.Lock()
			defer mu.Unlock()
			k := r.Header.Get(HeaderKey)
			arrived[k]++
			if firstSeen[k] {
				return false
			}
			firstSeen[k] = true
			return true
		}
		ps.observe = func(e idempotency.Event) {
			if e.Kind != idempotency.EventConflict {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if ch, ok := conflicted[e.Key]; ok {
				close(ch)
				delete(conflicted, e.Key)
			}
		}
		ps.hold = func(r *http.Request) {
			mu.Lock()
			ch := conflicted[idempotency.StorageKey("", r.Header.Get(HeaderKey))]
			mu.Unlock()
			if ch != nil {
				<-ch
			}
		}
	}, idempotency.WithLease(time.Second))

	tr := NewTransport(nil, WithBackoff(time.Millisecond, 20*time.Millisecond), WithMaxAttempts(20))
	hc := &http.Client{Transport: tr}
	results := make([][perKey]string, keys)
	attempts := make([][perKey]int, keys)
	var wg sync.WaitGroup
	for k := range keys {
		for c := range perKey {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req := post(t, context.Background(), ps.srv.URL, fmt.Sprintf("payment %d", k))
				req.Header.Set(HeaderKey, fmt.Sprintf("key-%d", k))
				resp, err := hc.Do(req)
				if err != nil {
					t.Errorf("key %d: %v", k, err)
					return
				}
				body := readBody(t, resp)
				if resp.StatusCode != 201 {
					t.Errorf("key %d: status %d", k, resp.StatusCode)
				}
				results[k][c], attempts[k][c] = body, Attempts(resp)
			}()
		}
	}
	wg.Wait()
	if got := ps.executed.Load(); got != keys {
		t.Errorf("handler ran %d times for %d keys", got, keys)
	}
	if got := ps.conflicts.Load(); got < keys {
		t.Errorf("%d conflicts, want at least one per key", got)
	}
	for k, r := range results {
		if r[0] == "" || r[0] != r[1] || !strings.Contains(r[0], fmt.Sprintf("payment %d", k)) {
			t.Errorf("key %d: answers %q", k, r)
		}
		// The key's first answer (the 409 or the payment) was lost, so
		// one of the two clients sent its request again: the Transport, or
		// net/http's own transport below it, which resends a request with
		// an Idempotency-Key by itself when a reused connection closes
		// before any answer (Attempts then does not count it).
		mu.Lock()
		n := arrived[fmt.Sprintf("key-%d", k)]
		mu.Unlock()
		if n < perKey+1 {
			t.Errorf("key %d: %d requests reached the server (attempts %v), want at least %d", k, n, attempts[k], perKey+1)
		}
	}
}
