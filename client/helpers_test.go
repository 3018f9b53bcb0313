package client

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/internal/fakeclock"
)

// fakeClock is a fake clock whose sleep advances it at once and records
// the delay.
type fakeClock struct {
	*fakeclock.Clock
	mu    sync.Mutex
	slept []time.Duration
}

func newFakeClock() *fakeClock {
	return &fakeClock{Clock: fakeclock.New(time.Unix(1_700_000_000, 0))}
}

func (c *fakeClock) sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.Advance(d)
	c.slept = append(c.slept, d)
	return nil
}

func (c *fakeClock) delays() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.slept...)
}

// newTestTransport returns a Transport on clock whose jitter always picks the
// ceiling, so delays are deterministic.
func newTestTransport(base http.RoundTripper, clock *fakeClock, opts ...Option) *Transport {
	tr := NewTransport(base, opts...)
	tr.now = clock.Now
	tr.sleep = clock.sleep
	tr.jitter = func(c time.Duration) time.Duration { return c }
	return tr
}

// seen is one request as a test server received it.
type seen struct {
	method string
	key    string
	keys   int // number of Idempotency-Key header lines
	body   string
}

// script answers the i-th request with steps[i] (the last step repeats) and
// records every request.
type script struct {
	mu    sync.Mutex
	reqs  []seen
	steps []step
}

type step struct {
	status     int
	retryAfter string
	replayed   bool
	body       string
}

func (s *script) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.reqs = append(s.reqs, seen{r.Method, r.Header.Get(HeaderKey), len(r.Header.Values(HeaderKey)), string(b)})
	st := s.steps[min(len(s.reqs), len(s.steps))-1]
	s.mu.Unlock()
	if st.retryAfter != "" {
		w.Header().Set("Retry-After", st.retryAfter)
	}
	if st.replayed {
		w.Header().Set(headerReplayed, "true")
	}
	w.WriteHeader(st.status)
	body := st.body
	if body == "" {
		body = "status " + strconv.Itoa(st.status)
	}
	_, _ = io.WriteString(w, body)
}

func (s *script) requests() []seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seen(nil), s.reqs...)
}

func newScriptServer(t *testing.T, steps ...step) (*httptest.Server, *script) {
	t.Helper()
	s := &script{steps: steps}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return srv, s
}

func post(t *testing.T, ctx context.Context, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func readBody(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading body: %v", err)
	}
	return string(b)
}
