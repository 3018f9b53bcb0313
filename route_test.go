package idempotency_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/go-idempotency/idempotency"
)

// TestRouteServeMux: events name the ServeMux pattern that served the
// request, whether the middleware wraps one route's handler or the whole
// mux, for executed requests and replays alike.
func TestRouteServeMux(t *testing.T) {
	created := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	for _, wrapMux := range []bool{false, true} {
		var mu sync.Mutex
		got := map[idempotency.EventKind]string{}
		mw := idempotency.New(newMemStore(t), idempotency.WithObserver(func(e idempotency.Event) {
			mu.Lock()
			got[e.Kind] = e.Route
			mu.Unlock()
		}))
		mux := http.NewServeMux()
		var h http.Handler = mux
		if wrapMux {
			mux.Handle("POST /payments/{id}", created)
			h = mw(mux)
		} else {
			mux.Handle("POST /payments/{id}", mw(created))
		}
		for i := 0; i < 2; i++ {
			req := newPost("/payments/42", "k")
			rec := newRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusCreated {
				t.Fatalf("wrapMux=%v request %d: %d", wrapMux, i, rec.Code)
			}
		}
		for _, kind := range []idempotency.EventKind{idempotency.EventExecuted, idempotency.EventReplayed} {
			if got[kind] != "POST /payments/{id}" {
				t.Fatalf("wrapMux=%v: %v event's route %q", wrapMux, kind, got[kind])
			}
		}
	}
}

func newPost(path, key string) *http.Request {
	req := httptest.NewRequest(http.MethodPost, path, nil)
	req.Header.Set("Idempotency-Key", key)
	return req
}

func newRecorder() *httptest.ResponseRecorder { return httptest.NewRecorder() }
