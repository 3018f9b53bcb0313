package redisstore_test

import (
	"bytes"
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
	"github.com/go-idempotency/idempotency/internal/redistest"
)

// paymentHandler answers 201 with a body naming the call, counting calls.
// While gate is non-nil, it blocks until gate is closed.
type paymentHandler struct {
	calls   atomic.Int64
	gate    chan struct{}
	entered chan struct{}
}

func (h *paymentHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := h.calls.Add(1)
	if h.entered != nil {
		select {
		case h.entered <- struct{}{}:
		default:
		}
	}
	if h.gate != nil {
		<-h.gate
	}
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/payments/1")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"call":%d,"echo":%q}`, n, body)
}

func post(t *testing.T, url, key, body string) (*http.Response, []byte) {
	t.Helper()
	r, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func TestHTTPFirstThenReplay(t *testing.T) {
	s := newStore(t, newClient(t))
	h := &paymentHandler{}
	srv := httptest.NewServer(idempotency.New(s)(h))
	defer srv.Close()

	first, firstBody := post(t, srv.URL+"/payments", "pay-1", `{"amount":10}`)
	if first.StatusCode != http.StatusCreated || first.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first: %d %v", first.StatusCode, first.Header)
	}
	second, secondBody := post(t, srv.URL+"/payments", "pay-1", `{"amount":10}`)
	if second.StatusCode != http.StatusCreated || second.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d %v", second.StatusCode, second.Header)
	}
	if !bytes.Equal(firstBody, secondBody) {
		t.Fatalf("replayed body %q, want %q", secondBody, firstBody)
	}
	if second.Header.Get("Location") != "/payments/1" || second.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("replayed headers %v", second.Header)
	}
	if n := h.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	// Same key, another payload: 422, and the record is untouched.
	third, _ := post(t, srv.URL+"/payments", "pay-1", `{"amount":99}`)
	if third.StatusCode != http.StatusUnprocessableEntity {
		t.Fatalf("mismatch: %d", third.StatusCode)
	}
	again, againBody := post(t, srv.URL+"/payments", "pay-1", `{"amount":10}`)
	if again.StatusCode != http.StatusCreated || !bytes.Equal(againBody, firstBody) {
		t.Fatalf("replay after mismatch: %d %q", again.StatusCode, againBody)
	}
}

func TestHTTPConcurrentDuplicatesRunOnce(t *testing.T) {
	s := newStore(t, newClient(t))
	h := &paymentHandler{}
	srv := httptest.NewServer(idempotency.New(s)(h))
	defer srv.Close()
	const n = 100
	tr := &http.Transport{MaxIdleConnsPerHost: n}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}

	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	bodies := map[string]int{}
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":10}`))
			r.Header.Set("Idempotency-Key", "dup-key")
			resp, err := client.Do(r)
			if err != nil {
				t.Error(err)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			mu.Lock()
			statuses[resp.StatusCode]++
			if resp.StatusCode == http.StatusCreated {
				bodies[string(b)]++
			}
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	if c := h.calls.Load(); c != 1 {
		t.Fatalf("handler ran %d times for %d duplicates, want exactly 1", c, n)
	}
	if statuses[http.StatusCreated]+statuses[http.StatusConflict] != n {
		t.Fatalf("statuses %v, want only 201 and 409", statuses)
	}
	if len(bodies) != 1 {
		t.Fatalf("201 bodies differ: %v", bodies)
	}
}

func TestHTTPWaitModeOverPubSub(t *testing.T) {
	c := newClient(t)
	s := newStore(t, c)
	h := &paymentHandler{gate: make(chan struct{}), entered: make(chan struct{}, 1)}
	srv := httptest.NewServer(idempotency.New(s, idempotency.WithWait(10*time.Second), idempotency.WithLease(time.Minute))(h))
	defer srv.Close()

	type result struct {
		status int
		body   []byte
		header http.Header
	}
	firstDone := make(chan result, 1)
	go func() {
		resp, b := post(t, srv.URL, "wait-key", "x")
		firstDone <- result{resp.StatusCode, b, resp.Header}
	}()
	<-h.entered
	waiterDone := make(chan result, 1)
	go func() {
		resp, b := post(t, srv.URL, "wait-key", "x")
		waiterDone <- result{resp.StatusCode, b, resp.Header}
	}()
	// Wait until the duplicate subscribed to the record's channel and
	// marked the record as watched, then let the original finish: its
	// complete publishes, and only the notification (not the holder's
	// one-minute lease) can end the wait in time.
	key := idempotency.StorageKey("", "wait-key")
	if !waitUntil(5*time.Second, func() bool {
		n, err := c.PubSubNumSub(ctx, s.Channel(key)).Result()
		return err == nil && n[s.Channel(key)] > 0 && isWatched(c, s.RecordKey(key))
	}) {
		t.Fatal("duplicate never subscribed and marked the record")
	}
	start := time.Now()
	close(h.gate)
	first := <-firstDone
	waited := <-waiterDone
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Fatalf("waiter took %v after completion", elapsed)
	}
	if waited.status != http.StatusCreated || waited.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(waited.body, first.body) {
		t.Fatalf("waiter got %d %q, want replay of %q", waited.status, waited.body, first.body)
	}
	if n := h.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
}

// TestHTTPRoundTrips counts Redis commands per HTTP request through the
// middleware: first request 2, replay 1, conflict 1.
func TestHTTPRoundTrips(t *testing.T) {
	c := hookedClient(t, redistest.Addr(t))
	counter := &commandCounter{}
	c.AddHook(counter)
	s := newStore(t, c)
	h := &paymentHandler{gate: make(chan struct{}), entered: make(chan struct{}, 1)}
	close(h.gate)
	srv := httptest.NewServer(idempotency.New(s)(h))
	defer srv.Close()

	// The response is sent before the record is completed: completed
	// waits for the complete, looking through a client the counter does
	// not see.
	raw := clientFor(t, c.Options().Addr)
	completed := func(key string) {
		t.Helper()
		rkey := s.RecordKey(idempotency.StorageKey("", key))
		if !redistest.WaitFor(5*time.Second, func() bool { return recordState(raw, rkey) == "complete" }) {
			t.Fatalf("record of %s not completed", key)
		}
	}

	post(t, srv.URL, "warm-up", "w") // loads the scripts
	completed("warm-up")
	post(t, srv.URL, "warm-up", "w")

	counter.reset()
	if resp, _ := post(t, srv.URL, "rt-1", "a"); resp.StatusCode != http.StatusCreated {
		t.Fatalf("first: %d", resp.StatusCode)
	}
	completed("rt-1")
	if n := counter.commands.Load(); n != 2 {
		t.Errorf("first request: %d Redis commands, want 2 (acquire, complete)", n)
	}
	counter.reset()
	if resp, _ := post(t, srv.URL, "rt-1", "a"); resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d", resp.StatusCode)
	}
	if n := counter.commands.Load(); n != 1 {
		t.Errorf("replay: %d Redis commands, want 1", n)
	}

	// A conflict: hold the original in the handler.
	slow := &paymentHandler{gate: make(chan struct{}), entered: make(chan struct{}, 1)}
	srv2 := httptest.NewServer(idempotency.New(s, idempotency.WithLease(time.Minute))(slow))
	defer srv2.Close()
	done := make(chan struct{})
	go func() { post(t, srv2.URL, "rt-2", "b"); close(done) }()
	<-slow.entered
	counter.reset()
	if resp, _ := post(t, srv2.URL, "rt-2", "b"); resp.StatusCode != http.StatusConflict {
		t.Fatalf("conflict: %d", resp.StatusCode)
	}
	if n := counter.commands.Load(); n != 1 {
		t.Errorf("conflict: %d Redis commands, want 1", n)
	}
	close(slow.gate)
	<-done
}
