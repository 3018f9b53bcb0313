package replaycache_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/fakeclock"
	"github.com/go-idempotency/idempotency/memstore"
)

// newFakeClock returns a clock that moves only when told to.
func newFakeClock() *fakeclock.Clock {
	return fakeclock.New(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
}

// counting is a Store that counts the Acquires that reach it.
type counting struct {
	idempotency.Store
	acquires atomic.Int64
}

func (s *counting) Acquire(ctx context.Context, req idempotency.AcquireRequest) (idempotency.Acquisition, error) {
	s.acquires.Add(1)
	return s.Store.Acquire(ctx, req)
}

// newMemstore returns a memstore on clock (the real one if nil), closed
// when t ends.
func newMemstore(t *testing.T, clock *fakeclock.Clock) *memstore.Store {
	t.Helper()
	var opts []memstore.Option
	if clock != nil {
		opts = append(opts, memstore.WithClock(clock.Now))
	}
	s := memstore.New(opts...)
	t.Cleanup(func() { s.Close() })
	return s
}

// stub is a Store whose Acquire answers what answer returns, after gate
// opens when gate is set, and records every request it gets. Its other
// methods are those of the embedded Store, nil unless set.
type stub struct {
	idempotency.Store
	answer  func(idempotency.AcquireRequest) (idempotency.Acquisition, error)
	gate    chan struct{} // nil: no wait
	entered chan idempotency.AcquireRequest

	mu    sync.Mutex
	calls []idempotency.AcquireRequest
}

func newStub(answer func(idempotency.AcquireRequest) (idempotency.Acquisition, error)) *stub {
	return &stub{answer: answer, entered: make(chan idempotency.AcquireRequest, 1024)}
}

func (s *stub) Acquire(ctx context.Context, req idempotency.AcquireRequest) (idempotency.Acquisition, error) {
	s.mu.Lock()
	s.calls = append(s.calls, req)
	s.mu.Unlock()
	s.entered <- req
	if s.gate != nil {
		select {
		case <-s.gate:
		case <-ctx.Done():
			return idempotency.Acquisition{}, ctx.Err()
		}
	}
	return s.answer(req)
}

func (s *stub) requests() []idempotency.AcquireRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]idempotency.AcquireRequest(nil), s.calls...)
}

// completed answers Completed with resp and expiresIn.
func completed(resp *idempotency.Response, expiresIn time.Duration) func(idempotency.AcquireRequest) (idempotency.Acquisition, error) {
	return func(idempotency.AcquireRequest) (idempotency.Acquisition, error) {
		return idempotency.Acquisition{Outcome: idempotency.Completed, Response: resp, ExpiresIn: expiresIn}, nil
	}
}

func request(key, token, fp string) idempotency.AcquireRequest {
	return idempotency.AcquireRequest{Key: key, Token: token, Fingerprint: fp, Lease: time.Minute, TTL: time.Hour}
}

// acquire calls Acquire on s and fails t on error.
func acquire(t *testing.T, s idempotency.Store, key, token, fp string) idempotency.Acquisition {
	t.Helper()
	a, err := s.Acquire(context.Background(), request(key, token, fp))
	if err != nil {
		t.Fatalf("Acquire(%s, %s, %s): %v", key, token, fp, err)
	}
	return a
}

// complete acquires key with token and fp on s and completes it with
// resp, kept for ttl.
func complete(t *testing.T, s idempotency.Store, key, token, fp string, resp *idempotency.Response, ttl time.Duration) {
	t.Helper()
	if a := acquire(t, s, key, token, fp); a.Outcome != idempotency.Acquired {
		t.Fatalf("Acquire of %s: %+v, want acquired", key, a)
	}
	if err := s.Complete(context.Background(), key, token, resp, ttl); err != nil {
		t.Fatalf("Complete of %s: %v", key, err)
	}
}

// response returns a response whose body and Location name tag.
func response(tag string) *idempotency.Response {
	return &idempotency.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/payments/" + tag}},
		Body:   []byte(`{"id":"` + tag + `"}`),
	}
}
