package replaycache_test

import (
	"context"
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
	"github.com/go-idempotency/idempotency/replaycache"
)

// holdFirst is a Store whose first Acquire waits until n callers wait
// for it in the cache.
type holdFirst struct {
	counting
	t     *testing.T
	cache *replaycache.Cache
	n     int
	once  sync.Once
}

func (s *holdFirst) Acquire(ctx context.Context, req idempotency.AcquireRequest) (idempotency.Acquisition, error) {
	s.once.Do(func() {
		deadline := time.Now().Add(10 * time.Second)
		for s.cache.Waiters(req.Key) != s.n {
			if time.Now().After(deadline) {
				s.t.Errorf("only %d requests wait for the first, want %d", s.cache.Waiters(req.Key), s.n)
				return
			}
			time.Sleep(time.Millisecond)
		}
	})
	return s.counting.Acquire(ctx, req)
}

// TestConcurrentFirstRequestsRunOnce: N first requests for one fresh key
// at once, over HTTP, through the middleware and a cache; the store holds
// the first Acquire until all the others wait for it. One runs the
// handler; the handler holds until every other one has been answered, and
// each of those must have been answered 409 through a store call of its
// own: had the cache handed the first one's Acquired to the others, they
// would have run the handler too.
func TestConcurrentFirstRequestsRunOnce(t *testing.T) {
	t.Parallel()
	const n = 32
	store := &holdFirst{counting: counting{Store: newMemstore(t, nil)}, t: t, n: n - 1}
	c := replaycache.New(store)
	store.cache = c
	var runs atomic.Int64
	othersDone := make(chan struct{})
	h := idempotency.New(c)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		select {
		case <-othersDone:
		case <-time.After(10 * time.Second):
			t.Error("the other requests were not answered while the handler ran")
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "paid")
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	defer client.CloseIdleConnections()

	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		conflicts int
		created   int
		other     []string
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":100}`))
			req.Header.Set(idempotency.HeaderKey, "order-1")
			res, err := client.Do(req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				other = append(other, err.Error())
				return
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			switch {
			case res.StatusCode == http.StatusConflict:
				if conflicts++; conflicts == n-1 {
					close(othersDone)
				}
			case res.StatusCode == http.StatusCreated && res.Header.Get(idempotency.HeaderReplayed) == "":
				created++
			default:
				other = append(other, fmt.Sprint(res.StatusCode))
			}
		}()
	}
	wg.Wait()
	if runs.Load() != 1 || created != 1 || conflicts != n-1 || len(other) != 0 {
		t.Fatalf("handler runs %d, created %d, conflicts %d, other answers %q; want 1, 1, %d, none",
			runs.Load(), created, conflicts, other, n-1)
	}
	if got := store.acquires.Load(); got != n {
		t.Fatalf("store Acquires = %d, want %d: each request its own", got, n)
	}
	// The first client may be answered before the record is stored:
	// duplicates get 409 until it is.
	waitFor(t, "the record to be stored", func() bool {
		status, _, _ := post(h, "order-1")
		return status != http.StatusConflict
	})
	// Now the record is complete and kept: the next duplicates hit.
	calls := store.acquires.Load()
	for i := range 3 {
		status, body, replayed := post(h, "order-1")
		if status != http.StatusCreated || body != "paid" || !replayed {
			t.Fatalf("duplicate %d: %d %q replayed=%v", i, status, body, replayed)
		}
	}
	if got := store.acquires.Load(); got != calls {
		t.Fatalf("store Acquires went from %d to %d for three duplicates of a kept record", calls, got)
	}
}
