package idempotency_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/reliability"
)

// stalledStore wraps a store and stalls chosen calls as a frozen server or
// network does: an Acquire takes effect at once but its reply comes late; an
// Extend never answers, whatever its context says (a client library deep in
// its own retries); a Complete answers only when its context ends or the
// test lets it.
type stalledStore struct {
	idempotency.Store
	acquireReply atomic.Int64 // how long Acquire's reply is held, in nanoseconds

	mu           sync.Mutex
	acquireCalls []time.Time // when each Acquire was called
	extendHang   bool
	extendDue    []time.Time // the deadline of each Extend's context (zero: none)

	completeHold chan struct{} // non-nil: Complete waits for it, or its context
	completing   chan struct{} // closed when a Complete is held
	once         sync.Once
	stop         chan struct{} // closed by unstall: every stall ends
	stopOnce     sync.Once
}

func newStalledStore(t *testing.T) *stalledStore {
	s := &stalledStore{Store: newMemStore(t), stop: make(chan struct{}), completing: make(chan struct{})}
	t.Cleanup(s.unstall)
	return s
}

// unstall ends every stall, so that a server waiting for its handlers can
// close.
func (s *stalledStore) unstall() { s.stopOnce.Do(func() { close(s.stop) }) }

func (s *stalledStore) Acquire(ctx context.Context, req idempotency.AcquireRequest) (idempotency.Acquisition, error) {
	s.mu.Lock()
	s.acquireCalls = append(s.acquireCalls, time.Now())
	s.mu.Unlock()
	a, err := s.Store.Acquire(ctx, req)
	select {
	case <-time.After(time.Duration(s.acquireReply.Load())): // only real time shows a lease running out
	case <-s.stop:
	}
	return a, err
}

func (s *stalledStore) firstAcquire() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.acquireCalls[0]
}

func (s *stalledStore) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	s.mu.Lock()
	due, _ := ctx.Deadline()
	s.extendDue = append(s.extendDue, due)
	hang := s.extendHang
	s.mu.Unlock()
	if hang {
		<-s.stop
		return errors.New("stalled")
	}
	return s.Store.Extend(ctx, key, token, lease)
}

func (s *stalledStore) Complete(ctx context.Context, key, token string, resp *idempotency.Response, ttl time.Duration) error {
	if s.completeHold != nil {
		s.once.Do(func() { close(s.completing) })
		select {
		case <-s.completeHold:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.stop:
			return errors.New("stalled")
		}
	}
	return s.Store.Complete(ctx, key, token, resp, ttl)
}

// TestSlowAcquireDoesNotStart: an acquire whose reply took more than half
// the lease is not used: the handler does not start on what is left of the
// lease, the key is released and the client gets 503; its retry runs the
// handler once, on a fresh record (not a steal).
func TestSlowAcquireDoesNotStart(t *testing.T) {
	const lease = 200 * time.Millisecond
	store := newStalledStore(t)
	store.acquireReply.Store(int64(120 * time.Millisecond))
	var kinds []idempotency.EventKind
	c := &counter{}
	h := idempotency.New(store, idempotency.WithLease(lease), idempotency.WithObserver(func(_ context.Context, e idempotency.Event) {
		kinds = append(kinds, e.Kind)
	}))(c)
	res := do(h, http.MethodPost, "k", "")
	if body := readAll(t, res); res.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, string(idempotency.CodeStoreUnavailable)) {
		t.Fatalf("slow acquire: %d %s, want 503 store_unavailable", res.StatusCode, body)
	}
	if c.n.Load() != 0 {
		t.Fatal("the handler started on a lease with less than half of it left")
	}
	store.acquireReply.Store(0)
	if res := do(h, http.MethodPost, "k", ""); res.StatusCode != http.StatusCreated || c.n.Load() != 1 {
		t.Fatalf("retry: %d, %d executions", res.StatusCode, c.n.Load())
	}
	for _, k := range kinds {
		if k == idempotency.EventStolen {
			t.Fatalf("the retry stole the record: the slow acquire's lease was not released (events %v)", kinds)
		}
	}
	reliability.Report(t, reliability.Result{Scenario: "fault: stalled store calls", Store: "memstore",
		Operations: 2, Faults: 1, Note: "acquire over lease/2: released unused, 503"})
}

// leaseProbe is a handler whose first execution waits for its context to
// end, reports when and why, and returns once released.
type leaseProbe struct {
	entered  chan struct{}
	release  chan struct{}
	endedAt  chan time.Time
	cause    chan error
	runs     atomic.Int64
	enterOne sync.Once
}

func newLeaseProbe() *leaseProbe {
	return &leaseProbe{entered: make(chan struct{}), release: make(chan struct{}),
		endedAt: make(chan time.Time, 1), cause: make(chan error, 1)}
}

func (p *leaseProbe) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if p.runs.Add(1) > 1 {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "second")
		return
	}
	p.enterOne.Do(func() { close(p.entered) })
	select {
	case <-r.Context().Done():
		p.endedAt <- time.Now()
		p.cause <- context.Cause(r.Context())
	case <-time.After(5 * time.Second):
	}
	<-p.release
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, "first")
}

// awaitCancel returns when the probe's context was cancelled, failing the
// test if it was not, or not for a lost lease.
func (p *leaseProbe) awaitCancel(t *testing.T) time.Time {
	t.Helper()
	select {
	case at := <-p.endedAt:
		if err := <-p.cause; !errors.Is(err, idempotency.ErrLeaseLost) {
			t.Fatalf("context cancelled with %v, want a cause wrapping ErrLeaseLost", err)
		}
		return at
	case <-time.After(6 * time.Second):
		t.Fatal("the handler's context was never cancelled")
	}
	return time.Time{}
}

// TestLeaseCountsFromSend: the middleware counts the lease from before the
// acquire was sent, not from its reply. With the reply held for 40% of the
// lease and every extend failing, the handler's context is cancelled before
// the store's lease (taken when the call arrived) runs out, so a duplicate
// right then still gets 409 and no two handlers ever run at once.
func TestLeaseCountsFromSend(t *testing.T) {
	const lease = 500 * time.Millisecond
	store := newStalledStore(t)
	store.acquireReply.Store(int64(200 * time.Millisecond))
	fs := &failingStore{Store: store}
	unreachable := errors.New("connection reset")
	fs.extendErr.Store(&unreachable)
	probe := newLeaseProbe()
	defer close(probe.release)
	h := idempotency.New(fs, idempotency.WithLease(lease))(probe)
	go do(h, http.MethodPost, "k", "")
	<-probe.entered
	store.acquireReply.Store(0)
	cancelled := probe.awaitCancel(t)
	if after := cancelled.Sub(store.firstAcquire()); after >= lease {
		t.Fatalf("context cancelled %v after the acquire was sent: the store's lease of %v had run out", after, lease)
	}
	if res := do(h, http.MethodPost, "k", ""); res.StatusCode != http.StatusConflict {
		t.Fatalf("duplicate right after the cancellation: %d, want 409 (lease still held in the store)", res.StatusCode)
	}
	reliability.Report(t, reliability.Result{Scenario: "fault: stalled store calls", Store: "memstore",
		Operations: 2, Faults: 2, Note: "lease counted from the acquire's send: handler cancelled before the store's lease ended"})
}

// TestExtendBoundedByLease: an extend that never answers (a stalled server,
// a client library retrying) does not keep the handler going: its context
// carries the lease's end as deadline, and the handler's context is
// cancelled before the store's lease runs out whatever the extend does.
func TestExtendBoundedByLease(t *testing.T) {
	const lease = 300 * time.Millisecond
	store := newStalledStore(t)
	store.extendHang = true
	probe := newLeaseProbe()
	defer close(probe.release)
	h := idempotency.New(store, idempotency.WithLease(lease))(probe)
	go do(h, http.MethodPost, "k", "")
	<-probe.entered
	cancelled := probe.awaitCancel(t)
	sent := store.firstAcquire()
	if after := cancelled.Sub(sent); after >= lease {
		t.Fatalf("context cancelled %v after the acquire was sent, past the lease of %v", after, lease)
	}
	store.mu.Lock()
	dues := append([]time.Time(nil), store.extendDue...)
	store.mu.Unlock()
	if len(dues) == 0 {
		t.Fatal("no extend was attempted")
	}
	for _, due := range dues {
		if due.IsZero() || !due.Before(sent.Add(lease)) {
			t.Fatalf("extend deadline %v (zero: none), want one before the lease ends at %v", due.Sub(sent), lease)
		}
	}
	reliability.Report(t, reliability.Result{Scenario: "fault: stalled store calls", Store: "memstore",
		Operations: 1 + int64(len(dues)), Faults: int64(len(dues)),
		Note: "extend that never answers: handler cancelled " + cancelled.Sub(sent).Round(time.Millisecond).String() + " into a 300ms lease"})
}

// TestCompleteBoundedAndResponseFirst: a Complete that does not answer keeps
// neither the client nor the server's goroutine waiting past the lease, and
// the client has the whole response while it is pending.
func TestCompleteBoundedAndResponseFirst(t *testing.T) {
	const lease = 300 * time.Millisecond
	store := newStalledStore(t)
	store.completeHold = make(chan struct{}) // never released: Complete ends with its context
	var served atomic.Int64                  // nanoseconds ServeHTTP took
	var events []idempotency.Event
	var mu sync.Mutex
	mw := idempotency.New(store, idempotency.WithLease(lease), idempotency.WithObserver(func(_ context.Context, e idempotency.Event) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}))
	inner := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "charged")
	}))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		inner.ServeHTTP(w, r)
		served.Store(int64(time.Since(start)))
	}))
	defer srv.Close()
	defer store.unstall()
	got := make(chan string, 1)
	go func() { _, body := post(t, srv.Client(), srv.URL, "k", ""); got <- body }()
	select {
	case <-store.completing:
	case <-time.After(5 * time.Second):
		t.Fatal("Complete was never called")
	}
	select {
	case body := <-got:
		if body != "charged" {
			t.Fatalf("client got %q", body)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the client did not get its response while Complete was pending")
	}
	waitFor(t, 5*time.Second, "ServeHTTP to return", func() bool { return served.Load() != 0 })
	if d := time.Duration(served.Load()); d > lease+time.Second {
		t.Fatalf("ServeHTTP took %v with a stalled Complete; want it bounded by the lease (%v)", d, lease)
	}
	mu.Lock()
	defer mu.Unlock()
	found := false
	for _, e := range events {
		found = found || (e.Kind == idempotency.EventStoreError && e.Err != nil && strings.Contains(e.Err.Error(), "complete"))
	}
	if !found {
		t.Fatalf("the failed complete was not reported: %+v", events)
	}
	reliability.Report(t, reliability.Result{Scenario: "fault: stalled store calls", Store: "memstore",
		Operations: 1, Faults: 1, Note: "complete that never answers: client answered first, ServeHTTP done in " +
			time.Duration(served.Load()).Round(time.Millisecond).String()})
}

// TestResponseBeforeStore: the client has the whole response, status, headers
// and body, while the middleware is still writing the record: a small
// response is given a Content-Length, a large one keeps the handler's, and
// both are flushed before Complete is called.
func TestResponseBeforeStore(t *testing.T) {
	large := strings.Repeat("x", 64<<10)
	for name, handler := range map[string]http.HandlerFunc{
		"small, no length": func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "small")
		},
		"implicit status": func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "small")
		},
		"large, declared length": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "65536")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, large)
		},
	} {
		t.Run(name, func(t *testing.T) {
			store := newStalledStore(t)
			store.completeHold = make(chan struct{})
			srv := httptest.NewServer(idempotency.New(store)(handler))
			defer srv.Close()
			defer store.unstall()
			got := make(chan string, 1)
			go func() { _, body := post(t, srv.Client(), srv.URL, "k", ""); got <- body }()
			var first string
			select {
			case first = <-got:
			case <-time.After(5 * time.Second):
				t.Fatal("the client did not get the whole response while the store was being written")
			}
			if first != "small" && first != large {
				t.Fatalf("client got %d bytes", len(first))
			}
			close(store.completeHold)
			waitFor(t, 5*time.Second, "the replay", func() bool {
				res, body := post(t, srv.Client(), srv.URL, "k", "")
				return res != nil && res.Header.Get("Idempotent-Replayed") == "true" && body == first
			})
		})
	}
}

// waitFor polls cond every 5ms until it holds, failing t after timeout.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
