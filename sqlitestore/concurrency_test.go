package sqlitestore_test

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/go-idempotency/idempotency"
)

// TestMiddlewareConcurrency: 32 clients send the same 200 keys, each in
// its own order, through the middleware on one file. Every handler run is
// counted: each key runs exactly once, and every other answer is its
// replay or a 409 for a duplicate in flight.
func TestMiddlewareConcurrency(t *testing.T) {
	const clients, keys = 32, 200
	s := open(t, newPath(t))
	var runs [keys]atomic.Int64
	h := idempotency.New(s)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var k int
		fmt.Sscanf(r.Header.Get(idempotency.HeaderKey), "key-%d", &k)
		runs[k].Add(1)
		fmt.Fprintf(w, "ran key-%d", k)
	}))
	var (
		wg                   sync.WaitGroup
		fresh, replays, busy atomic.Int64
		mu                   sync.Mutex
		unexpected           []string
	)
	for range clients {
		wg.Go(func() {
			for _, k := range rand.Perm(keys) {
				req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader("amount=1"))
				req.Header.Set(idempotency.HeaderKey, fmt.Sprintf("key-%d", k))
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				switch {
				case rec.Code == http.StatusOK && rec.Body.String() == fmt.Sprintf("ran key-%d", k):
					if rec.Header().Get(idempotency.HeaderReplayed) == "true" {
						replays.Add(1)
					} else {
						fresh.Add(1)
					}
				case rec.Code == http.StatusConflict:
					busy.Add(1)
				default:
					mu.Lock()
					unexpected = append(unexpected, fmt.Sprintf("key-%d: %d %q", k, rec.Code, rec.Body.String()))
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	for _, u := range unexpected {
		t.Error(u)
	}
	for k := range runs {
		if n := runs[k].Load(); n != 1 {
			t.Errorf("key-%d ran %d times, want once", k, n)
		}
	}
	if fresh.Load() != keys {
		t.Errorf("%d first executions answered, want %d", fresh.Load(), keys)
	}
	t.Logf("%d requests: %d executions, %d replays, %d in flight (409)", clients*keys, fresh.Load(), replays.Load(), busy.Load())
}
