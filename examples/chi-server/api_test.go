package main

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/memstore"
)

// The demo's bearer tokens (accounts in auth.go), as the banner prints them.
const (
	aliceToken = "alice-token"
	bobToken   = "bob-token"
)

type client struct {
	t   *testing.T
	url string
}

// newMemClient serves the API on a memstore for the test and returns its
// client; both are stopped when the test ends.
func newMemClient(t *testing.T) client {
	store := memstore.New()
	t.Cleanup(func() { store.Close() })
	srv := httptest.NewServer(newAPI(&backend{store: store}, slog.New(slog.DiscardHandler)).routes())
	t.Cleanup(srv.Close)
	return client{t, srv.URL}
}

// post sends body to path with the bearer token and the Idempotency-Key,
// each when not empty.
func (c client) post(path, token, key, body string) (*http.Response, string) {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, c.url+path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return c.do(req)
}

// get reads path with the bearer token.
func (c client) get(path, token string) (*http.Response, string) {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, c.url+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	return c.do(req)
}

// do sends req and returns its response, with the body read.
func (c client) do(req *http.Request) (*http.Response, string) {
	c.t.Helper()
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
	c := newMemClient(t)
	const body = `{"amount":1999,"currency":"EUR"}`

	first, firstBody := c.post("/payments", aliceToken, "order-1", body)
	if first.StatusCode != 201 || !strings.Contains(firstBody, `"id":"pay_`) {
		t.Fatalf("first: %d %s", first.StatusCode, firstBody)
	}
	again, againBody := c.post("/payments", aliceToken, "order-1", body)
	if again.StatusCode != 201 || againBody != firstBody || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d %q %v", again.StatusCode, againBody, again.Header)
	}
	if again.Header.Get("Location") != first.Header.Get("Location") {
		t.Fatal("replay lost the Location header")
	}
	if res, _ := c.post("/payments", aliceToken, "order-1", `{"amount":5000,"currency":"EUR"}`); res.StatusCode != 422 {
		t.Fatalf("changed body: %d", res.StatusCode)
	}
	if res, _ := c.post("/payments", aliceToken, "", body); res.StatusCode != 400 {
		t.Fatalf("no key: %d", res.StatusCode)
	}
	if res, _ := c.post("/payments", "", "order-1", body); res.StatusCode != 401 || !strings.HasPrefix(res.Header.Get("WWW-Authenticate"), "Bearer") {
		t.Fatalf("no token: %d %v", res.StatusCode, res.Header)
	}
	// Bob's order-1 is another payment: keys are scoped per user.
	bob, bobBody := c.post("/payments", bobToken, "order-1", body)
	if bob.StatusCode != 201 || bob.Header.Get("Idempotent-Replayed") != "" || bobBody == firstBody {
		t.Fatalf("bob: %d %s", bob.StatusCode, bobBody)
	}
	if n := c.executed(); n != 2 {
		t.Fatalf("executed %d payments, want 2", n)
	}
	// The stored payment is readable by its owner only.
	loc := first.Header.Get("Location")
	if res, b := c.get(loc, aliceToken); res.StatusCode != 200 || b != firstBody {
		t.Fatalf("alice's GET %s: %d %s", loc, res.StatusCode, b)
	}
	if res, b := c.get(loc, bobToken); res.StatusCode != 404 {
		t.Fatalf("bob's GET %s: %d %s", loc, res.StatusCode, b)
	}
}

// TestScopeComesFromTheToken: the principal is the user whose token the
// request carries. An X-User header naming alice gets nothing of hers:
// with bob's token the request is bob's, and without a valid token it is
// refused before the idempotency middleware runs.
func TestScopeComesFromTheToken(t *testing.T) {
	c := newMemClient(t)
	const body = `{"amount":1999,"currency":"EUR"}`
	alice, aliceBody := c.post("/payments", aliceToken, "order-1", body)
	if alice.StatusCode != http.StatusCreated || !strings.Contains(aliceBody, `"user":"alice"`) {
		t.Fatalf("alice: %d %s", alice.StatusCode, aliceBody)
	}

	for _, tc := range []struct {
		name, authorization string
		status              int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"user name as token", "Bearer alice", http.StatusUnauthorized},
		{"unknown token", "Bearer alice-token-x", http.StatusUnauthorized},
		{"empty token", "Bearer ", http.StatusUnauthorized},
		{"other scheme", "Basic " + aliceToken, http.StatusUnauthorized},
		{"bob's token", "Bearer " + bobToken, http.StatusCreated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := client{t, c.url}
			req, _ := http.NewRequest(http.MethodPost, c.url+"/payments", strings.NewReader(body))
			req.Header.Set("X-User", "alice")
			req.Header.Set("Idempotency-Key", "order-1")
			if tc.authorization != "" {
				req.Header.Set("Authorization", tc.authorization)
			}
			res, b := c.do(req)
			if res.StatusCode != tc.status || res.Header.Get("Idempotent-Replayed") != "" || b == aliceBody || strings.Contains(b, `"user":"alice"`) {
				t.Fatalf("%d %v %s; want %d, not alice's payment", res.StatusCode, res.Header, b, tc.status)
			}
			if tc.status == http.StatusUnauthorized && !strings.HasPrefix(res.Header.Get("WWW-Authenticate"), "Bearer") {
				t.Fatalf("401 without a Bearer challenge: %v", res.Header)
			}
			if tc.status == http.StatusCreated && !strings.Contains(b, `"user":"bob"`) {
				t.Fatalf("payment %s, want bob's", b)
			}
			// Alice's payment stays hers, whatever X-User says.
			req, _ = http.NewRequest(http.MethodGet, c.url+alice.Header.Get("Location"), nil)
			req.Header.Set("X-User", "alice")
			if tc.authorization != "" {
				req.Header.Set("Authorization", tc.authorization)
			}
			if res, b := c.do(req); res.StatusCode == http.StatusOK || strings.Contains(b, `"user":"alice"`) {
				t.Fatalf("GET alice's payment: %d %s", res.StatusCode, b)
			}
		})
	}
	// Only alice's and bob's payments ran, and alice's key still replays
	// hers to her.
	if n := c.executed(); n != 2 {
		t.Fatalf("executed %d payments, want 2", n)
	}
	if res, b := c.post("/payments", aliceToken, "order-1", body); res.Header.Get("Idempotent-Replayed") != "true" || b != aliceBody {
		t.Fatalf("alice's replay: %d %v %s", res.StatusCode, res.Header, b)
	}
}

// TestSchemeIsCaseInsensitive: the authentication scheme is matched
// without regard to case (RFC 9110, section 11.1).
func TestSchemeIsCaseInsensitive(t *testing.T) {
	for _, h := range []string{"Bearer alice-token", "bearer alice-token", "BEARER alice-token"} {
		if u, ok := verify(h); !ok || u != "alice" {
			t.Errorf("verify(%q) = %q, %v; want alice", h, u, ok)
		}
	}
}

// TestServerTimeouts: the server bounds the time a request takes to
// arrive, body included, and not the time a slow payment takes to answer.
func TestServerTimeouts(t *testing.T) {
	srv := newServer(http.NotFoundHandler())
	if srv.ReadHeaderTimeout <= 0 || srv.ReadTimeout <= 0 || srv.IdleTimeout <= 0 {
		t.Errorf("ReadHeaderTimeout %v, ReadTimeout %v, IdleTimeout %v: want all set", srv.ReadHeaderTimeout, srv.ReadTimeout, srv.IdleTimeout)
	}
	if srv.WriteTimeout != 0 && srv.WriteTimeout <= 10*time.Second {
		t.Errorf("WriteTimeout %v cuts off a payment with ?delay=10s", srv.WriteTimeout)
	}
}

// TestProviderFailureReleasesKey: a payment whose provider fails answers
// 502 and keeps nothing, and its key is released: the retry runs the
// payment.
func TestProviderFailureReleasesKey(t *testing.T) {
	c := newMemClient(t)
	const body = `{"amount":1999,"currency":"EUR"}`
	if res, b := c.post("/payments?provider=down", aliceToken, "order-1", body); res.StatusCode != http.StatusBadGateway {
		t.Fatalf("provider down: %d %s", res.StatusCode, b)
	}
	if n := c.executed(); n != 0 {
		t.Fatalf("%d payments after a failed one", n)
	}
	res, b := c.post("/payments", aliceToken, "order-1", body)
	if res.StatusCode != http.StatusCreated || res.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry: %d %v %s", res.StatusCode, res.Header, b)
	}
	if n := c.executed(); n != 1 {
		t.Fatalf("%d payments after the retry, want 1", n)
	}
}
