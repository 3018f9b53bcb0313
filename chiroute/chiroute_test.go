package chiroute_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/chiroute"
	"github.com/go-idempotency/idempotency/memstore"
)

// routes records the Route of every event by kind.
type routes struct {
	mu  sync.Mutex
	all map[idempotency.EventKind][]string
}

func (r *routes) observe(_ context.Context, e idempotency.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.all == nil {
		r.all = map[idempotency.EventKind][]string{}
	}
	r.all[e.Kind] = append(r.all[e.Kind], e.Route)
}

func (r *routes) of(kind idempotency.EventKind) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.all[kind]...)
}

func post(t *testing.T, h http.Handler, path, key string) int {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, path, nil)
	req.Header.Set("Idempotency-Key", key)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code
}

func created(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }

// TestRoutePatterns: the events of an executed request and of its replay
// carry the pattern of the chi route, however the middleware is mounted.
func TestRoutePatterns(t *testing.T) {
	for _, tc := range []struct {
		name  string
		build func(mw func(http.Handler) http.Handler) http.Handler
		opts  []idempotency.Option
	}{
		{"r.Use with chiroute.Pattern", func(mw func(http.Handler) http.Handler) http.Handler {
			r := chi.NewRouter()
			r.Use(mw)
			r.Post("/payments/{id}", created)
			return r
		}, []idempotency.Option{idempotency.WithRoute(chiroute.Pattern)}},
		{"r.With", func(mw func(http.Handler) http.Handler) http.Handler {
			r := chi.NewRouter()
			r.With(mw).Post("/payments/{id}", created)
			return r
		}, nil},
		{"mounted subrouter, r.Use", func(mw func(http.Handler) http.Handler) http.Handler {
			sub := chi.NewRouter()
			sub.Post("/{id}", created)
			r := chi.NewRouter()
			r.Use(mw)
			r.Mount("/payments", sub)
			return r
		}, []idempotency.Option{idempotency.WithRoute(chiroute.Pattern)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := memstore.New()
			defer store.Close()
			var got routes
			mw := idempotency.New(store, append(tc.opts, idempotency.WithObserver(got.observe))...)
			h := tc.build(mw)
			for i := 0; i < 2; i++ {
				if code := post(t, h, "/payments/42", "k"); code != http.StatusCreated {
					t.Fatalf("request %d: %d", i, code)
				}
			}
			const want = "/payments/{id}"
			for _, kind := range []idempotency.EventKind{idempotency.EventExecuted, idempotency.EventReplayed} {
				if r := got.of(kind); len(r) != 1 || r[0] != want {
					t.Fatalf("%v events' routes %q, want [%q]", kind, r, want)
				}
			}
		})
	}
}

func TestPatternOutsideChi(t *testing.T) {
	if p := chiroute.Pattern(httptest.NewRequest(http.MethodPost, "/x", nil)); p != "" {
		t.Fatalf("outside a chi router: %q", p)
	}
}
