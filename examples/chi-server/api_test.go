package main

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-idempotency/idempotency/memstore"
)

type client struct {
	t   *testing.T
	url string
}

func (c client) post(path, user, key, body string) (*http.Response, string) {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, c.url+path, strings.NewReader(body))
	if user != "" {
		req.Header.Set("X-User", user)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

func (c client) executed() int64 {
	c.t.Helper()
	res, err := http.Get(c.url + "/stats")
	if err != nil {
		c.t.Fatal(err)
	}
	defer res.Body.Close()
	var s map[string]int64
	if err := json.NewDecoder(res.Body).Decode(&s); err != nil {
		c.t.Fatal(err)
	}
	return s["payments_executed"]
}

func TestPaymentsAPI(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	srv := httptest.NewServer(newAPI(store, nil, slog.New(slog.DiscardHandler)).routes())
	defer srv.Close()
	c := client{t, srv.URL}
	const body = `{"amount":1999,"currency":"EUR"}`

	first, firstBody := c.post("/payments", "alice", "order-1", body)
	if first.StatusCode != 201 || !strings.Contains(firstBody, `"id":"pay_`) {
		t.Fatalf("first: %d %s", first.StatusCode, firstBody)
	}
	again, againBody := c.post("/payments", "alice", "order-1", body)
	if again.StatusCode != 201 || againBody != firstBody || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d %q %v", again.StatusCode, againBody, again.Header)
	}
	if again.Header.Get("Location") != first.Header.Get("Location") {
		t.Fatal("replay lost the Location header")
	}
	if res, _ := c.post("/payments", "alice", "order-1", `{"amount":5000,"currency":"EUR"}`); res.StatusCode != 422 {
		t.Fatalf("changed body: %d", res.StatusCode)
	}
	if res, _ := c.post("/payments", "alice", "", body); res.StatusCode != 400 {
		t.Fatalf("no key: %d", res.StatusCode)
	}
	if res, _ := c.post("/payments", "", "order-1", body); res.StatusCode != 401 {
		t.Fatalf("no user: %d", res.StatusCode)
	}
	// Bob's order-1 is another payment: keys are scoped per user.
	bob, bobBody := c.post("/payments", "bob", "order-1", body)
	if bob.StatusCode != 201 || bob.Header.Get("Idempotent-Replayed") != "" || bobBody == firstBody {
		t.Fatalf("bob: %d %s", bob.StatusCode, bobBody)
	}
	if n := c.executed(); n != 2 {
		t.Fatalf("executed %d payments, want 2", n)
	}
	// The stored payment is readable by its owner only.
	loc := first.Header.Get("Location")
	req, _ := http.NewRequest(http.MethodGet, srv.URL+loc, nil)
	req.Header.Set("X-User", "alice")
	res, err := http.DefaultClient.Do(req)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("get %s: %v %v", loc, res, err)
	}
	res.Body.Close()
}

// TestProviderFailureReleasesKey: a payment whose provider fails answers
// 502 and keeps nothing, and its key is released: the retry runs the
// payment.
func TestProviderFailureReleasesKey(t *testing.T) {
	store := memstore.New()
	defer store.Close()
	srv := httptest.NewServer(newAPI(store, nil, slog.New(slog.DiscardHandler)).routes())
	defer srv.Close()
	c := client{t, srv.URL}
	const body = `{"amount":1999,"currency":"EUR"}`
	if res, b := c.post("/payments?provider=down", "alice", "order-1", body); res.StatusCode != http.StatusBadGateway {
		t.Fatalf("provider down: %d %s", res.StatusCode, b)
	}
	if n := c.executed(); n != 0 {
		t.Fatalf("%d payments after a failed one", n)
	}
	res, b := c.post("/payments", "alice", "order-1", body)
	if res.StatusCode != http.StatusCreated || res.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry: %d %v %s", res.StatusCode, res.Header, b)
	}
	if n := c.executed(); n != 1 {
		t.Fatalf("%d payments after the retry, want 1", n)
	}
}
