package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
)

func TestSetsFreshKeyAndLeavesCallerRequestAlone(t *testing.T) {
	srv, s := newScriptServer(t, step{status: 201})
	tr := newTestTransport(nil, newFakeClock())
	hc := &http.Client{Transport: tr}

	req := post(t, context.Background(), srv.URL, `{"amount":1}`)
	req.Header.Set("X-Other", "kept")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)

	got := s.requests()
	if len(got) != 1 {
		t.Fatalf("server saw %d requests, want 1", len(got))
	}
	id, err := uuid.Parse(got[0].key)
	if err != nil {
		t.Fatalf("key %q is not a UUID: %v", got[0].key, err)
	}
	if id.Version() != 4 {
		t.Errorf("key version = %d, want 4", id.Version())
	}
	if req.Header.Get(HeaderKey) != "" {
		t.Errorf("caller's request was modified: it now has key %q", req.Header.Get(HeaderKey))
	}
	if req.Header.Get("X-Other") != "kept" {
		t.Errorf("caller's header lost")
	}
	if Key(resp) != got[0].key {
		t.Errorf("Key(resp) = %q, want %q", Key(resp), got[0].key)
	}
	if Attempts(resp) != 1 || Replayed(resp) {
		t.Errorf("Attempts = %d, Replayed = %v; want 1, false", Attempts(resp), Replayed(resp))
	}
}

func TestKeepsCallerKey(t *testing.T) {
	srv, s := newScriptServer(t, step{status: 503}, step{status: 201})
	tr := newTestTransport(nil, newFakeClock())
	req := post(t, context.Background(), srv.URL, "x")
	req.Header.Set(HeaderKey, `"caller-key"`)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	for i, r := range s.requests() {
		if r.key != `"caller-key"` || r.keys != 1 {
			t.Errorf("attempt %d sent key %q (%d lines), want the caller's once", i+1, r.key, r.keys)
		}
	}
	if Attempts(resp) != 2 {
		t.Errorf("Attempts = %d, want 2", Attempts(resp))
	}
}

func TestKeyPerRequestNotPerAttempt(t *testing.T) {
	srv, s := newScriptServer(t, step{status: 503}, step{status: 503}, step{status: 201}, step{status: 201})
	tr := newTestTransport(nil, newFakeClock())
	for range 2 {
		resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "x"))
		if err != nil {
			t.Fatal(err)
		}
		readBody(t, resp)
	}
	got := s.requests()
	if len(got) != 4 {
		t.Fatalf("server saw %d requests, want 4", len(got))
	}
	if got[0].key != got[1].key || got[1].key != got[2].key {
		t.Errorf("retries changed the key: %q %q %q", got[0].key, got[1].key, got[2].key)
	}
	if got[3].key == got[0].key {
		t.Errorf("two requests shared key %q", got[0].key)
	}
}

func TestRetriesStatuses(t *testing.T) {
	for _, code := range []int{409, 429, 502, 503, 504} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			srv, s := newScriptServer(t, step{status: code}, step{status: 201, body: "done"})
			tr := newTestTransport(nil, newFakeClock())
			resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "payload"))
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 201 || readBody(t, resp) != "done" {
				t.Fatalf("final status %d, want 201", resp.StatusCode)
			}
			if Attempts(resp) != 2 {
				t.Errorf("Attempts = %d, want 2", Attempts(resp))
			}
			got := s.requests()
			if len(got) != 2 || got[1].body != "payload" || got[0].key != got[1].key {
				t.Errorf("retry not identical: %+v", got)
			}
		})
	}
}

func TestDoesNotRetryOtherStatuses(t *testing.T) {
	for _, code := range []int{200, 201, 400, 401, 404, 413, 422, 500, 501} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			srv, s := newScriptServer(t, step{status: code}, step{status: 201})
			clock := newFakeClock()
			tr := newTestTransport(nil, clock)
			resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "x"))
			if err != nil {
				t.Fatal(err)
			}
			readBody(t, resp)
			if resp.StatusCode != code || Attempts(resp) != 1 || len(s.requests()) != 1 {
				t.Errorf("status %d, Attempts %d, server saw %d; want %d, 1, 1",
					resp.StatusCode, Attempts(resp), len(s.requests()), code)
			}
			if len(clock.delays()) != 0 {
				t.Errorf("slept %v", clock.delays())
			}
		})
	}
}

func TestReplayIsFinal(t *testing.T) {
	// A replayed 409 is the stored outcome of the request, not a duplicate in
	// flight: retrying could only replay it again.
	srv, s := newScriptServer(t, step{status: 409, replayed: true, body: "stored"}, step{status: 201})
	tr := newTestTransport(nil, newFakeClock())
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "x"))
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != 409 || body != "stored" {
		t.Fatalf("got %d %q, want the stored 409", resp.StatusCode, body)
	}
	if !Replayed(resp) || Attempts(resp) != 1 || len(s.requests()) != 1 {
		t.Errorf("Replayed %v, Attempts %d, server saw %d", Replayed(resp), Attempts(resp), len(s.requests()))
	}
}

func TestMethodsNotCoveredPassThrough(t *testing.T) {
	for _, method := range []string{http.MethodGet, http.MethodPut, http.MethodDelete, "post"} {
		t.Run(method, func(t *testing.T) {
			srv, s := newScriptServer(t, step{status: 503}, step{status: 201})
			tr := newTestTransport(nil, newFakeClock())
			req, _ := http.NewRequest(method, srv.URL, nil)
			info := &Info{}
			req = req.WithContext(WithInfo(req.Context(), info))
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			readBody(t, resp)
			got := s.requests()
			if len(got) != 1 || got[0].keys != 0 || resp.StatusCode != 503 {
				t.Errorf("server saw %+v, status %d; want one request without key and the 503", got, resp.StatusCode)
			}
			if resp.Request != req {
				t.Errorf("pass-through request was replaced")
			}
			if Attempts(resp) != 0 || info.Attempts != 0 {
				t.Errorf("Attempts = %d, info %+v; want 0 for a method not covered", Attempts(resp), info)
			}
		})
	}
}

func TestWithMethods(t *testing.T) {
	srv, s := newScriptServer(t, step{status: 503}, step{status: 200})
	tr := newTestTransport(nil, newFakeClock(), WithMethods(http.MethodPut))
	req, _ := http.NewRequest(http.MethodPut, srv.URL, strings.NewReader("x"))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	if got := s.requests(); len(got) != 2 || got[0].key == "" || Attempts(resp) != 2 {
		t.Errorf("PUT not covered: %+v, Attempts %d", got, Attempts(resp))
	}
	// POST is no longer covered.
	resp, err = tr.RoundTrip(post(t, context.Background(), srv.URL, "x"))
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	if got := s.requests(); len(got) != 3 || got[2].keys != 0 {
		t.Errorf("POST covered after WithMethods(PUT): %+v", got[2])
	}
}

// dropServer reads each request and then closes the connection without an
// answer, for the first n requests; later ones get 201.
func dropServer(t *testing.T, n int) (*httptest.Server, *script) {
	t.Helper()
	s := &script{steps: []step{{status: 201, body: "ok"}}}
	var dropped atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if dropped.Add(1) <= int64(n) {
			b, _ := io.ReadAll(r.Body)
			s.mu.Lock()
			s.reqs = append(s.reqs, seen{r.Method, r.Header.Get(HeaderKey), len(r.Header.Values(HeaderKey)), string(b)})
			s.mu.Unlock()
			conn, _, err := w.(http.Hijacker).Hijack()
			if err != nil {
				t.Errorf("hijack: %v", err)
				return
			}
			conn.Close()
			return
		}
		s.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, s
}

func TestRetriesLostResponses(t *testing.T) {
	srv, s := dropServer(t, 2)
	tr := newTestTransport(nil, newFakeClock())
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "payload"))
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); body != "ok" {
		t.Fatalf("body %q", body)
	}
	got := s.requests()
	if len(got) != 3 || Attempts(resp) != 3 {
		t.Fatalf("server saw %d requests, Attempts %d; want 3, 3", len(got), Attempts(resp))
	}
	for i, r := range got {
		if r.key != got[0].key || r.body != "payload" {
			t.Errorf("attempt %d: key %q body %q", i+1, r.key, r.body)
		}
	}
}

func TestConnectionRefusedExhaustsAttempts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	clock := newFakeClock()
	tr := newTestTransport(nil, clock, WithMaxAttempts(3))
	info := &Info{}
	req := post(t, WithInfo(context.Background(), info), "http://"+addr, "x")
	resp, err := tr.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
		t.Fatal("want an error")
	}
	var opErr *net.OpError
	if !errors.As(err, &opErr) {
		t.Errorf("error %v does not wrap the network error", err)
	}
	if info.Attempts != 3 || info.Key == "" || info.Replayed {
		t.Errorf("info = %+v, want 3 attempts and a key", info)
	}
	if len(clock.delays()) != 2 {
		t.Errorf("slept %v, want 2 waits", clock.delays())
	}
}

func TestNonRetryableErrorIsNotRetried(t *testing.T) {
	var calls atomic.Int64
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		calls.Add(1)
		return nil, errors.New("some permanent failure")
	})
	tr := newTestTransport(base, newFakeClock())
	_, err := tr.RoundTrip(post(t, context.Background(), "http://127.0.0.1:1", "x"))
	if err == nil || calls.Load() != 1 {
		t.Errorf("err %v after %d calls; want the error after 1", err, calls.Load())
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestBackoffIsExponentialAndCapped(t *testing.T) {
	srv, _ := newScriptServer(t, step{status: 503})
	clock := newFakeClock()
	tr := newTestTransport(nil, clock, WithMaxAttempts(6), WithBackoff(100*time.Millisecond, 500*time.Millisecond))
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "x"))
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	want := []time.Duration{100, 200, 400, 500, 500}
	got := clock.delays()
	if len(got) != len(want) {
		t.Fatalf("delays %v, want %v ms", got, want)
	}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Errorf("delay %d = %v, want %v", i+1, got[i], want[i]*time.Millisecond)
		}
	}
}

func TestJitterIsFull(t *testing.T) {
	srv, _ := newScriptServer(t, step{status: 503})
	clock := newFakeClock()
	tr := newTestTransport(nil, clock, WithMaxAttempts(4))
	var ceilings []time.Duration
	var mu sync.Mutex
	tr.jitter = func(c time.Duration) time.Duration {
		mu.Lock()
		defer mu.Unlock()
		ceilings = append(ceilings, c)
		return 0
	}
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "x"))
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	if fmt.Sprint(ceilings) != "[100ms 200ms 400ms]" {
		t.Errorf("jitter ceilings %v", ceilings)
	}
	if fmt.Sprint(clock.delays()) != "[0s 0s 0s]" {
		t.Errorf("delays %v, want the jittered zeros", clock.delays())
	}
	// The default source stays within [0, ceiling].
	for range 1000 {
		if d := fullJitter(time.Second); d < 0 || d > time.Second {
			t.Fatalf("fullJitter(1s) = %v", d)
		}
	}
	if fullJitter(0) != 0 {
		t.Errorf("fullJitter(0) != 0")
	}
}

func TestRetryAfterIsHonoured(t *testing.T) {
	date := time.Unix(1_700_000_000, 0).Add(3 * time.Second).UTC().Format(http.TimeFormat)
	for _, tc := range []struct {
		name, header string
		want         time.Duration
	}{
		{"seconds", "2", 2 * time.Second},
		{"date", date, 3 * time.Second},
		{"shorter than backoff", "0", 100 * time.Millisecond},
		{"malformed", "soon", 100 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, code := range []int{409, 429, 503} {
				srv, s := newScriptServer(t, step{status: code, retryAfter: tc.header}, step{status: 201})
				clock := newFakeClock()
				tr := newTestTransport(nil, clock)
				resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "x"))
				if err != nil {
					t.Fatal(err)
				}
				readBody(t, resp)
				if d := clock.delays(); len(d) != 1 || d[0] != tc.want || len(s.requests()) != 2 {
					t.Errorf("%d: delays %v, want [%v]", code, d, tc.want)
				}
			}
		})
	}
}

func TestRetryAfterBeyondBudgetEndsRetries(t *testing.T) {
	srv, s := newScriptServer(t, step{status: 503, retryAfter: "120", body: "busy"}, step{status: 201})
	clock := newFakeClock()
	tr := newTestTransport(nil, clock, WithMaxElapsed(time.Minute))
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "x"))
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != 503 || body != "busy" {
		t.Errorf("got %d %q, want the 503 with its body intact", resp.StatusCode, body)
	}
	if len(s.requests()) != 1 || Attempts(resp) != 1 || len(clock.delays()) != 0 {
		t.Errorf("server saw %d, Attempts %d, delays %v", len(s.requests()), Attempts(resp), clock.delays())
	}
}

func TestContextDeadlineEndsRetries(t *testing.T) {
	srv, s := newScriptServer(t, step{status: 503, retryAfter: "5"}, step{status: 201})
	tr := NewTransport(nil) // real clock
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, "x"))
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	if resp.StatusCode != 503 || len(s.requests()) != 1 {
		t.Errorf("status %d after %d requests, want the 503 at once", resp.StatusCode, len(s.requests()))
	}
	if el := time.Since(start); el > time.Second {
		t.Errorf("waited %v for a retry that could not happen before the deadline", el)
	}
}

func TestMaxAttempts(t *testing.T) {
	for _, n := range []int{1, 2, 5} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			srv, s := newScriptServer(t, step{status: 502, body: "bad gateway"})
			tr := newTestTransport(nil, newFakeClock(), WithMaxAttempts(n))
			resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "x"))
			if err != nil {
				t.Fatal(err)
			}
			if body := readBody(t, resp); resp.StatusCode != 502 || body != "bad gateway" {
				t.Errorf("got %d %q", resp.StatusCode, body)
			}
			if len(s.requests()) != n || Attempts(resp) != n {
				t.Errorf("server saw %d, Attempts %d; want %d", len(s.requests()), Attempts(resp), n)
			}
		})
	}
}

func TestMaxElapsed(t *testing.T) {
	srv, s := newScriptServer(t, step{status: 503})
	clock := newFakeClock()
	// Delays 1s, 2s, 4s: the third retry would start at 7s > 3.5s.
	tr := newTestTransport(nil, clock, WithMaxAttempts(10), WithBackoff(time.Second, time.Minute), WithMaxElapsed(3500*time.Millisecond))
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "x"))
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	if len(s.requests()) != 3 || Attempts(resp) != 3 {
		t.Errorf("server saw %d, Attempts %d; want 3", len(s.requests()), Attempts(resp))
	}
	if fmt.Sprint(clock.delays()) != "[1s 2s]" {
		t.Errorf("delays %v", clock.delays())
	}
}

func TestCancelDuringBackoffReturnsPromptly(t *testing.T) {
	srv, s := newScriptServer(t, step{status: 503, retryAfter: "30"}, step{status: 201})
	tr := NewTransport(nil, WithMaxElapsed(time.Minute))
	waiting := make(chan struct{})
	tr.sleep = func(ctx context.Context, d time.Duration) error {
		close(waiting)
		return sleepContext(ctx, d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-waiting
		cancel()
	}()
	start := time.Now()
	resp, err := tr.RoundTrip(post(t, ctx, srv.URL, "x"))
	if err == nil {
		resp.Body.Close()
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("returned after %v, not promptly", el)
	}
	if len(s.requests()) != 1 {
		t.Errorf("server saw %d requests, want 1", len(s.requests()))
	}
}

func TestSleepContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	if err := sleepContext(ctx, time.Millisecond); err != nil {
		t.Errorf("sleep: %v", err)
	}
	cancel()
	if err := sleepContext(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("sleep after cancel: %v", err)
	}
	if err := sleepContext(ctx, 0); !errors.Is(err, context.Canceled) {
		t.Errorf("zero sleep after cancel: %v", err)
	}
}

// onceReader is a request body without GetBody.
type onceReader struct {
	io.Reader
	closed atomic.Bool
}

func (r *onceReader) Close() error { r.closed.Store(true); return nil }

func TestBodyNotRewindable(t *testing.T) {
	t.Run("after a status", func(t *testing.T) {
		srv, s := newScriptServer(t, step{status: 503}, step{status: 201})
		tr := newTestTransport(nil, newFakeClock())
		body := &onceReader{Reader: strings.NewReader("payload")}
		req, _ := http.NewRequest(http.MethodPost, srv.URL, body)
		info := &Info{}
		req = req.WithContext(WithInfo(req.Context(), info))
		resp, err := tr.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
			t.Fatal("want an error")
		}
		if !errors.Is(err, ErrBodyNotRewindable) || !strings.Contains(err.Error(), "503") {
			t.Errorf("err = %v, want ErrBodyNotRewindable naming the 503", err)
		}
		if len(s.requests()) != 1 || s.requests()[0].body != "payload" || info.Attempts != 1 {
			t.Errorf("server saw %+v, info %+v", s.requests(), info)
		}
		if !body.closed.Load() {
			t.Errorf("request body not closed")
		}
	})
	t.Run("after a network error", func(t *testing.T) {
		srv, s := dropServer(t, 1)
		tr := newTestTransport(nil, newFakeClock())
		req, _ := http.NewRequest(http.MethodPost, srv.URL, &onceReader{Reader: strings.NewReader("payload")})
		resp, err := tr.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
			t.Fatal("want an error")
		}
		t.Logf("error: %v", err)
		if !errors.Is(err, ErrBodyNotRewindable) || !retryableError(err) {
			t.Errorf("err = %v, want ErrBodyNotRewindable with the network error", err)
		}
		if len(s.requests()) != 1 {
			t.Errorf("server saw %d requests", len(s.requests()))
		}
	})
	t.Run("not needed", func(t *testing.T) {
		srv, _ := newScriptServer(t, step{status: 201})
		tr := newTestTransport(nil, newFakeClock())
		req, _ := http.NewRequest(http.MethodPost, srv.URL, &onceReader{Reader: strings.NewReader("payload")})
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		readBody(t, resp)
		if resp.StatusCode != 201 {
			t.Errorf("status %d", resp.StatusCode)
		}
	})
	t.Run("GetBody fails", func(t *testing.T) {
		srv, s := newScriptServer(t, step{status: 503}, step{status: 201})
		tr := newTestTransport(nil, newFakeClock())
		req := post(t, context.Background(), srv.URL, "payload")
		boom := errors.New("boom")
		req.GetBody = func() (io.ReadCloser, error) { return nil, boom }
		_, err := tr.RoundTrip(req)
		if !errors.Is(err, ErrBodyNotRewindable) || !errors.Is(err, boom) {
			t.Errorf("err = %v", err)
		}
		if len(s.requests()) != 1 {
			t.Errorf("server saw %d requests", len(s.requests()))
		}
	})
}

func TestDiscardedResponsesFreeTheirConnection(t *testing.T) {
	s := &script{steps: []step{{status: 503, body: strings.Repeat("x", 4096)}, {status: 503}, {status: 503}, {status: 201}}}
	srv := httptest.NewUnstartedServer(s)
	var conns atomic.Int64
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)

	tr := newTestTransport(&http.Transport{}, newFakeClock())
	t.Cleanup(tr.CloseIdleConnections)
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "x"))
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	if Attempts(resp) != 4 || conns.Load() != 1 {
		t.Errorf("Attempts %d over %d connections; want 4 over 1", Attempts(resp), conns.Load())
	}
}

func TestConcurrentUse(t *testing.T) {
	// Every key is answered 503 on its first attempt and 201 afterwards.
	var mu sync.Mutex
	perKey := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		key := r.Header.Get(HeaderKey)
		mu.Lock()
		perKey[key]++
		n := perKey[key]
		mu.Unlock()
		if n == 1 {
			w.WriteHeader(503)
			return
		}
		w.WriteHeader(201)
		w.Write(body)
	}))
	t.Cleanup(srv.Close)

	tr := NewTransport(nil, WithBackoff(time.Millisecond, 5*time.Millisecond))
	hc := &http.Client{Transport: tr}
	const workers, each = 16, 10
	var wg sync.WaitGroup
	var ok atomic.Int64
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				want := fmt.Sprintf("w%d-r%d", w, i)
				req, _ := http.NewRequest(http.MethodPost, srv.URL, bytes.NewBufferString(want))
				resp, err := hc.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 201 || string(body) != want || Attempts(resp) != 2 {
					t.Errorf("%s: %d %q after %d attempts", want, resp.StatusCode, body, Attempts(resp))
					continue
				}
				ok.Add(1)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != workers*each {
		t.Fatalf("%d of %d requests succeeded", ok.Load(), workers*each)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(perKey) != workers*each {
		t.Errorf("%d distinct keys for %d requests", len(perKey), workers*each)
	}
	for k, n := range perKey {
		if n != 2 {
			t.Errorf("key %s sent %d times, want 2", k, n)
		}
	}
}

func TestOddRequests(t *testing.T) {
	tr := newTestTransport(nil, newFakeClock())
	if _, err := tr.RoundTrip(nil); err == nil {
		t.Error("nil request: want an error")
	}

	srv, s := newScriptServer(t, step{status: 201})
	req, _ := http.NewRequest(http.MethodPost, srv.URL, nil)
	req.Header = nil
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	if s.requests()[0].key == "" {
		t.Errorf("request with nil Header got no key")
	}

	tr.newKey = func() (string, error) { return "", errors.New("no entropy") }
	body := &onceReader{Reader: strings.NewReader("x")}
	req, _ = http.NewRequest(http.MethodPost, srv.URL, body)
	if _, err := tr.RoundTrip(req); err == nil || !strings.Contains(err.Error(), "no entropy") {
		t.Errorf("key generation failure: err = %v", err)
	}
	if !body.closed.Load() {
		t.Errorf("request body not closed after key generation failed")
	}
	if len(s.requests()) != 1 {
		t.Errorf("a request without a key was sent")
	}
}

func TestAttemptsIgnoresInheritedContext(t *testing.T) {
	srv, _ := newScriptServer(t, step{status: 503}, step{status: 201})
	tr := newTestTransport(nil, newFakeClock())
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "x"))
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	// A request made with the context of the previous response's request
	// must not report that response's attempts.
	req, _ := http.NewRequestWithContext(resp.Request.Context(), http.MethodGet, srv.URL, nil)
	resp2, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp2)
	if Attempts(resp) != 2 || Attempts(resp2) != 0 {
		t.Errorf("Attempts = %d, %d; want 2, 0", Attempts(resp), Attempts(resp2))
	}
	if Attempts(nil) != 0 || Replayed(nil) || Key(nil) != "" {
		t.Errorf("nil response")
	}
}

func TestInfoOnSuccess(t *testing.T) {
	srv, s := newScriptServer(t, step{status: 409, retryAfter: "1"}, step{status: 201, replayed: true})
	tr := newTestTransport(nil, newFakeClock())
	info := &Info{}
	resp, err := tr.RoundTrip(post(t, WithInfo(context.Background(), info), srv.URL, "x"))
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	if *info != (Info{Key: s.requests()[0].key, Attempts: 2, Replayed: true}) {
		t.Errorf("info = %+v", info)
	}
	if !Replayed(resp) || Attempts(resp) != 2 {
		t.Errorf("Replayed %v Attempts %d", Replayed(resp), Attempts(resp))
	}
}

func TestTransportTimeoutIsRetriedCallerTimeoutIsNot(t *testing.T) {
	release := make(chan struct{})
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		if calls.Add(1) == 1 {
			<-release // the first attempt never gets an answer in time
		}
		w.WriteHeader(201)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })

	t.Run("transport's own timeout", func(t *testing.T) {
		base := &http.Transport{ResponseHeaderTimeout: 50 * time.Millisecond}
		t.Cleanup(base.CloseIdleConnections)
		tr := newTestTransport(base, newFakeClock())
		resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "x"))
		if err != nil {
			t.Fatal(err)
		}
		readBody(t, resp)
		if resp.StatusCode != 201 || Attempts(resp) != 2 {
			t.Errorf("got %d after %d attempts, want 201 after 2", resp.StatusCode, Attempts(resp))
		}
	})
	t.Run("caller's deadline", func(t *testing.T) {
		calls.Store(0)
		tr := newTestTransport(nil, newFakeClock())
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		info := &Info{}
		_, err := tr.RoundTrip(post(t, WithInfo(ctx, info), srv.URL, "x"))
		if !errors.Is(err, context.DeadlineExceeded) || info.Attempts != 1 {
			t.Errorf("err = %v after %d attempts, want the deadline after 1", err, info.Attempts)
		}
	})
}
