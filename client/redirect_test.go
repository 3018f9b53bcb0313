package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/memstore"
)

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestRedirectThroughMiddleware: a POST with the caller's key to a route
// that answers 307 or 308 to another route of the same host, both behind
// the middleware, goes through once; the whole call repeated with the same
// key replays every hop, and the target's handler still ran once.
func TestRedirectThroughMiddleware(t *testing.T) {
	for _, status := range []int{http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		store := memstore.New()
		t.Cleanup(func() { store.Close() })
		var charges atomic.Int64
		mux := http.NewServeMux()
		mux.HandleFunc("POST /v1/charges", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "/v2/charges", status)
		})
		mux.HandleFunc("POST /v2/charges", func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, "charge %d for %s", charges.Add(1), body)
		})
		srv := httptest.NewServer(idempotency.New(store, idempotency.WithUnscopedKeys(true))(mux))
		t.Cleanup(srv.Close)

		for i := range 3 {
			resp, err := do(t, context.Background(), srv.URL+"/v1/charges", "order-42")
			if err != nil {
				t.Fatalf("%d, call %d: %v", status, i+1, err)
			}
			body := readBody(t, resp)
			if resp.StatusCode != http.StatusCreated || body != "charge 1 for pay 10 EUR" {
				t.Fatalf("%d, call %d: %d %q, want 201 and the first charge", status, i+1, resp.StatusCode, body)
			}
			if replayed := Replayed(resp); replayed != (i > 0) {
				t.Errorf("%d, call %d: replayed %v", status, i+1, replayed)
			}
		}
		if n := charges.Load(); n != 1 {
			t.Errorf("%d: the target ran %d times, want 1", status, n)
		}
	}
}

// hit is one request as a keyServer received it.
type hit struct {
	method, path, key, body string
}

// keyServer is a host that records every request it gets. A request whose
// path is in redirects is answered with that redirect; any other with 201.
type keyServer struct {
	srv       *httptest.Server
	redirects map[string]redirect

	mu   sync.Mutex
	hits []hit
}

type redirect struct {
	status   int
	location string
}

func newKeyServer(t *testing.T) *keyServer {
	t.Helper()
	ks := &keyServer{redirects: map[string]redirect{}}
	ks.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		ks.mu.Lock()
		ks.hits = append(ks.hits, hit{r.Method, r.URL.Path, r.Header.Get(HeaderKey), string(b)})
		rd, ok := ks.redirects[r.URL.Path]
		ks.mu.Unlock()
		if ok {
			http.Redirect(w, r, rd.location, rd.status)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(ks.srv.Close)
	return ks
}

// redirect makes the server answer requests for path with status and
// location.
func (ks *keyServer) redirect(path string, status int, location string) {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	ks.redirects[path] = redirect{status, location}
}

func (ks *keyServer) requests() []hit {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	return append([]hit(nil), ks.hits...)
}

// withKey counts the requests the server got that carried an
// Idempotency-Key.
func (ks *keyServer) withKey() int {
	n := 0
	for _, h := range ks.requests() {
		if h.key != "" {
			n++
		}
	}
	return n
}

func (ks *keyServer) hostPort(t *testing.T) string {
	t.Helper()
	u, err := url.Parse(ks.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// do sends a POST with body to url, with key as its Idempotency-Key unless
// it is "", through an http.Client on a Transport with opts.
func do(t *testing.T, ctx context.Context, url, key string, opts ...Option) (*http.Response, error) {
	t.Helper()
	req := post(t, ctx, url, "pay 10 EUR")
	if key != "" {
		req.Header.Set(HeaderKey, key)
	}
	hc := &http.Client{Transport: newTestTransport(nil, newFakeClock(), opts...)}
	return hc.Do(req)
}

func TestRedirectCrossHostRefusesCallerKey(t *testing.T) {
	a, b := newKeyServer(t), newKeyServer(t)
	a.redirect("/pay", http.StatusTemporaryRedirect, b.srv.URL+"/pay")

	info := &Info{}
	resp, err := do(t, WithInfo(context.Background(), info), a.srv.URL+"/pay", "order-42")
	if err == nil {
		readBody(t, resp)
		t.Fatal("want an error")
	}
	if !errors.Is(err, ErrCrossHostKey) {
		t.Errorf("err = %v, want one wrapping ErrCrossHostKey", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "from "+a.hostPort(t)+" to "+b.hostPort(t)) {
		t.Errorf("err = %q, want it to name both hosts", msg)
	}
	if n := b.withKey(); n != 0 {
		t.Errorf("the other host got %d requests with the key", n)
	}
	if n := len(b.requests()); n != 0 {
		t.Errorf("the other host got %d requests, want none", n)
	}
	if got := a.requests(); len(got) != 1 || got[0].key != "order-42" {
		t.Errorf("first host got %+v, want the one request with the key", got)
	}
	if *info != (Info{Key: "order-42"}) {
		t.Errorf("info = %+v, want the key and no attempt", *info)
	}
}

func TestRedirectCrossHostWithCrossHostKey(t *testing.T) {
	a, b := newKeyServer(t), newKeyServer(t)
	a.redirect("/pay", http.StatusPermanentRedirect, b.srv.URL+"/pay")

	resp, err := do(t, context.Background(), a.srv.URL+"/pay", "order-42", WithCrossHostKey(true))
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	derived := redirectedKey("order-42", http.MethodPost, mustURL(t, b.srv.URL+"/pay"))
	if resp.StatusCode != http.StatusCreated || Key(resp) != derived || Attempts(resp) != 1 {
		t.Errorf("got %d with key %q after %d attempts, want 201 with the key derived from the caller's after 1", resp.StatusCode, Key(resp), Attempts(resp))
	}
	if got := b.requests(); len(got) != 1 || got[0] != (hit{http.MethodPost, "/pay", derived, "pay 10 EUR"}) {
		t.Errorf("other host got %+v, want the POST with the derived key and its body", got)
	}
}

// TestRedirectSameHostDerivesKey: each hop of a redirect chain on the first
// request's host carries a key of its own, derived from the caller's and
// the hop's target.
func TestRedirectSameHostDerivesKey(t *testing.T) {
	a := newKeyServer(t)
	a.redirect("/pay", http.StatusTemporaryRedirect, "/v2/pay")
	a.redirect("/v2/pay", http.StatusPermanentRedirect, a.srv.URL+"/v3/pay")

	resp, err := do(t, context.Background(), a.srv.URL+"/pay", "order-42")
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	got := a.requests()
	if len(got) != 3 {
		t.Fatalf("server got %d requests, want 3: %+v", len(got), got)
	}
	keys := []string{"order-42",
		redirectedKey("order-42", http.MethodPost, mustURL(t, a.srv.URL+"/v2/pay")),
		redirectedKey("order-42", http.MethodPost, mustURL(t, a.srv.URL+"/v3/pay"))}
	for i, h := range got {
		if h.method != http.MethodPost || h.key != keys[i] || h.body != "pay 10 EUR" {
			t.Errorf("request %d = %+v, want the POST with key %q", i+1, h, keys[i])
		}
		if _, err := idempotency.ParseKey(h.key); err != nil {
			t.Errorf("request %d: key %q is not a valid key: %v", i+1, h.key, err)
		}
	}
	if resp.StatusCode != http.StatusCreated || Key(resp) != keys[2] {
		t.Errorf("got %d with key %q", resp.StatusCode, Key(resp))
	}
}

func TestRedirectNeverCarriesTransportKey(t *testing.T) {
	for _, allow := range []bool{false, true} {
		a, b := newKeyServer(t), newKeyServer(t)
		a.redirect("/pay", http.StatusTemporaryRedirect, "/v2/pay")
		a.redirect("/v2/pay", http.StatusTemporaryRedirect, b.srv.URL+"/pay")

		resp, err := do(t, context.Background(), a.srv.URL+"/pay", "", WithCrossHostKey(allow))
		if err != nil {
			t.Fatalf("WithCrossHostKey(%v): %v", allow, err)
		}
		readBody(t, resp)
		first, second := a.requests(), b.requests()
		if len(first) != 2 || len(second) != 1 {
			t.Fatalf("WithCrossHostKey(%v): hosts got %d and %d requests, want 2 and 1", allow, len(first), len(second))
		}
		// Every hop gets a fresh key of its own, on the same host too.
		keys := map[string]bool{}
		for _, h := range append(first, second...) {
			if id, err := uuid.Parse(h.key); err != nil || id.Version() != 4 {
				t.Errorf("WithCrossHostKey(%v): %s %s got key %q, want a UUIDv4", allow, h.method, h.path, h.key)
			}
			keys[h.key] = true
		}
		if len(keys) != 3 {
			t.Errorf("WithCrossHostKey(%v): keys %v, want one per hop", allow, keys)
		}
		if Key(resp) != second[0].key || resp.StatusCode != http.StatusCreated {
			t.Errorf("WithCrossHostKey(%v): Key(resp) = %q, status %d; want %q, 201", allow, Key(resp), resp.StatusCode, second[0].key)
		}
	}
}

func TestRedirectToGetDropsCallerKeyOnOtherHost(t *testing.T) {
	for _, status := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther} {
		a, b := newKeyServer(t), newKeyServer(t)
		// POST to a, GET on b, then back to a: the key is a's.
		a.redirect("/pay", status, b.srv.URL+"/receipt")
		b.redirect("/receipt", http.StatusFound, a.srv.URL+"/receipt")

		resp, err := do(t, context.Background(), a.srv.URL+"/pay", "order-42")
		if err != nil {
			t.Fatalf("%d: %v", status, err)
		}
		readBody(t, resp)
		if got := b.requests(); len(got) != 1 || got[0] != (hit{http.MethodGet, "/receipt", "", ""}) {
			t.Errorf("%d: other host got %+v, want a GET without the key", status, got)
		}
		want := []hit{{http.MethodPost, "/pay", "order-42", "pay 10 EUR"},
			{http.MethodGet, "/receipt", redirectedKey("order-42", http.MethodGet, mustURL(t, a.srv.URL+"/receipt")), ""}}
		if got := a.requests(); len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
			t.Errorf("%d: first host got %+v, want %+v", status, got, want)
		}
	}

	// Allowed, the key goes along.
	a, b := newKeyServer(t), newKeyServer(t)
	a.redirect("/pay", http.StatusSeeOther, b.srv.URL+"/receipt")
	resp, err := do(t, context.Background(), a.srv.URL+"/pay", "order-42", WithCrossHostKey(true))
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, resp)
	if got := b.requests(); len(got) != 1 || got[0].key != redirectedKey("order-42", http.MethodGet, mustURL(t, b.srv.URL+"/receipt")) {
		t.Errorf("WithCrossHostKey(true): other host got %+v, want the key derived from the caller's", got)
	}
}

func TestRedirectCrossHostRefusedForEveryMethod(t *testing.T) {
	a, b := newKeyServer(t), newKeyServer(t)
	a.redirect("/doc", http.StatusTemporaryRedirect, b.srv.URL+"/doc")
	for _, method := range []string{http.MethodPut, http.MethodGet} {
		req, _ := http.NewRequest(method, a.srv.URL+"/doc", strings.NewReader("v1"))
		req.Header.Set(HeaderKey, "doc-1")
		hc := &http.Client{Transport: NewTransport(nil)}
		resp, err := hc.Do(req)
		if err == nil {
			readBody(t, resp)
		}
		if !errors.Is(err, ErrCrossHostKey) {
			t.Errorf("%s: err = %v, want ErrCrossHostKey", method, err)
		}
	}
	if n := len(b.requests()); n != 0 {
		t.Errorf("the other host got %d requests", n)
	}
}

func TestRedirectRefusedWithoutTheChain(t *testing.T) {
	var calls int
	tr := NewTransport(roundTripFunc(func(*http.Request) (*http.Response, error) {
		calls++
		return nil, errors.New("sent")
	}))
	body := &onceReader{Reader: strings.NewReader("x")}
	req, _ := http.NewRequest(http.MethodPost, "http://b.example/pay", body)
	req.Header.Set(HeaderKey, "k")
	req.Response = &http.Response{StatusCode: http.StatusTemporaryRedirect} // no Request
	_, err := tr.RoundTrip(req)
	if !errors.Is(err, ErrCrossHostKey) || !strings.Contains(err.Error(), "unknown host to b.example:80") {
		t.Errorf("err = %v, want ErrCrossHostKey from an unknown host", err)
	}
	if calls != 0 {
		t.Errorf("base transport called %d times", calls)
	}
	if !body.closed.Load() {
		t.Errorf("request body not closed")
	}
}

func TestHostPort(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{"http://Example.COM/x", "http://example.com:80/y", true},
		{"HTTPS://example.com", "https://EXAMPLE.com:443", true},
		{"http://example.com", "https://example.com", false},
		{"http://127.0.0.1:8080", "http://127.0.0.1:8081", false},
		{"http://[::1]:8080", "http://[::1]:8080/", true},
		{"http://api.example.com", "http://example.com", false},
	} {
		ua, _ := url.Parse(tc.a)
		ub, _ := url.Parse(tc.b)
		if got := hostPort(ua) == hostPort(ub); got != tc.same {
			t.Errorf("%s vs %s: same = %v (%q, %q), want %v", tc.a, tc.b, got, hostPort(ua), hostPort(ub), tc.same)
		}
	}
	if u, _ := url.Parse("http://[::1]"); hostPort(u) != "[::1]:80" {
		t.Errorf("hostPort(%v) = %q", u, hostPort(u))
	}
}
