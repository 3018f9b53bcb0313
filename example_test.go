package idempotency_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/memstore"
)

// The middleware wraps a plain net/http handler: the first request with a key
// runs it, a duplicate gets the stored response.
func Example() {
	store := memstore.New()
	defer store.Close()

	charges := 0
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "charge #%d", charges)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /charges", idempotency.New(store)(charge))

	for i := 0; i < 2; i++ {
		req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{"amount":100}`))
		req.Header.Set("Idempotency-Key", "order-42")
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		body, _ := io.ReadAll(rec.Body)
		fmt.Printf("%d %s replayed=%q\n", rec.Code, body, rec.Header().Get("Idempotent-Replayed"))
	}
	fmt.Println("charges:", charges)
	// Output:
	// 201 charge #1 replayed=""
	// 201 charge #1 replayed="true"
	// charges: 1
}

// With chi, each route can have its own options: here keys are required,
// scoped to the user and kept for an hour on POST /payments. The user comes
// from authentication that runs before the middleware (authenticate, a
// stand-in for yours), never from a header the client chooses.
func Example_chi() {
	store := memstore.New()
	defer store.Close()

	r := chi.NewRouter()
	r.Use(authenticate)
	perUser := idempotency.WithKeyScope(userOf)
	r.With(idempotency.New(store, perUser, idempotency.WithKeyRequired(true), idempotency.WithTTL(time.Hour))).
		Post("/payments", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
		})

	req := httptest.NewRequest(http.MethodPost, "/payments", nil)
	req.Header.Set("Authorization", "Bearer alice-token")
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, req)
	fmt.Println(rec.Code, rec.Header().Get("Content-Type"))
	// Output:
	// 400 application/problem+json
}

type userKey struct{}

// authenticate stands for an application's authentication: it looks the
// request's bearer token up, puts its user in the request's context, and
// answers 401 to a request without a known token.
func authenticate(next http.Handler) http.Handler {
	tokens := map[string]string{"Bearer alice-token": "alice", "Bearer bob-token": "bob"}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, ok := tokens[r.Header.Get("Authorization")]
		if !ok {
			w.Header().Set("WWW-Authenticate", "Bearer")
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, user)))
	})
}

// userOf returns the user authenticate found, the scope of the request's
// keys.
func userOf(r *http.Request) string {
	user, _ := r.Context().Value(userKey{}).(string)
	return user
}

// WithObserver reports every request's outcome (and more), for counting in
// a metrics system.
func ExampleWithObserver() {
	store := memstore.New()
	defer store.Close()

	counts := map[string]int{}
	mw := idempotency.New(store, idempotency.WithObserver(func(_ context.Context, e idempotency.Event) {
		if e.Final { // one per request; Started, Stolen and others come in addition
			counts[e.Kind.String()]++ // use a concurrency-safe counter in production
		}
	}))
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for _, body := range []string{"a", "a", "b"} {
		req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", "k")
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	fmt.Println(counts)
	// Output:
	// map[executed:1 mismatch:1 replayed:1]
}

// ParseKey accepts the draft standard's quoted form and the bare form.
func ExampleParseKey() {
	for _, v := range []string{`"order-42"`, `order-42`, `"unterminated`} {
		key, err := idempotency.ParseKey(v)
		fmt.Printf("%q %v\n", key, err)
	}
	// Output:
	// "order-42" <nil>
	// "order-42" <nil>
	// "" idempotency: invalid key: bad quoting: a quoted key must end with '"' and escape only '"' and '\'
}

// Do runs any function once per key: here a charge keyed by its order. The
// second call with the same key and payload gets the first one's result,
// replayed, and the charge runs once.
func ExampleDo() {
	store := memstore.New()
	defer store.Close()
	charges := idempotency.NewRunner(store)

	type receipt struct{ ID string }
	n := 0
	charge := func(ctx context.Context) (receipt, error) {
		n++ // charge the card here
		return receipt{ID: fmt.Sprint("ch_", n)}, nil
	}
	c := idempotency.Call{Name: "charge", Key: "order-1001", Payload: []byte(`{"amount":1999}`)}
	for range 2 {
		res, err := idempotency.Do(context.Background(), charges, c, charge)
		fmt.Println(res.Value.ID, res.Replayed, err)
	}
	// A different payload under the same key is refused.
	c.Payload = []byte(`{"amount":5000}`)
	_, err := idempotency.Do(context.Background(), charges, c, charge)
	fmt.Println(err)
	// Output:
	// ch_1 false <nil>
	// ch_1 true <nil>
	// idempotency: key used with a different call
}
