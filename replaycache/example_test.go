package replaycache_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/memstore"
	"github.com/go-idempotency/idempotency/replaycache"
)

// The cache goes between the middleware and its store. The first duplicate
// of a completed request asks the store and keeps the record; the next
// ones are answered from memory.
func ExampleNew() {
	store := memstore.New()
	defer store.Close()
	cache := replaycache.New(store, replaycache.WithMaxAge(5*time.Second))

	charges := 0
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "charge #%d", charges)
	})
	h := idempotency.New(cache)(charge)

	for range 4 {
		req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{"amount":100}`))
		req.Header.Set("Idempotency-Key", "order-42")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		body, _ := io.ReadAll(rec.Body)
		fmt.Printf("%d %s replayed=%q\n", rec.Code, body, rec.Header().Get("Idempotent-Replayed"))
	}
	st := cache.Stats()
	fmt.Printf("charges: %d, store calls: %d, from the cache: %d\n", charges, st.Misses, st.Hits)
	// Output:
	// 201 charge #1 replayed=""
	// 201 charge #1 replayed="true"
	// 201 charge #1 replayed="true"
	// 201 charge #1 replayed="true"
	// charges: 1, store calls: 2, from the cache: 2
}
