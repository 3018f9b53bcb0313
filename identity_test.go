package idempotency_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/memstore"
)

// named is a handler that counts its executions and answers 201 with its
// name and the execution.
type named struct {
	name string
	n    atomic.Int64
}

func (h *named) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := h.n.Add(1)
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{%q:%d}`, h.name, n)
}

// send sends a POST with key and body to url.
func send(t *testing.T, url, key, body string, header ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set(idempotency.HeaderKey, key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return res, string(b)
}

// codeOf returns the code of a problem document, or "".
func codeOf(res *http.Response, body string) string {
	if res.Header.Get("Content-Type") != "application/problem+json" {
		return ""
	}
	_, rest, ok := strings.Cut(body, `"code":"`)
	if !ok {
		return ""
	}
	code, _, _ := strings.Cut(rest, `"`)
	return code
}

// TestAnotherRouteIsAnotherRequest: the route the client addressed (its
// method and path as sent, before any router or http.StripPrefix rewrote
// it) is part of the record's identity whatever fingerprint is configured,
// so a key sent to a second route is answered 422 fingerprint_mismatch,
// never with the first route's response, and the first route's record is
// untouched.
func TestAnotherRouteIsAnotherRequest(t *testing.T) {
	t.Run("BodyOnlyFingerprint", func(t *testing.T) {
		bodyOnly := idempotency.WithFingerprint(func(_ *http.Request, body []byte) string { return string(body) })
		mw := idempotency.New(newMemStore(t), bodyOnly)
		payments, refunds := &named{name: "payment"}, &named{name: "refund"}
		mux := http.NewServeMux()
		mux.Handle("POST /payments", mw(payments))
		mux.Handle("POST /refunds", mw(refunds))
		srv := httptest.NewServer(mux)
		defer srv.Close()

		first, firstBody := send(t, srv.URL+"/payments", "k", `{"amount":100}`)
		if first.StatusCode != http.StatusCreated {
			t.Fatalf("first payment: %d %s", first.StatusCode, firstBody)
		}
		res, body := send(t, srv.URL+"/refunds", "k", `{"amount":100}`)
		if res.Header.Get(idempotency.HeaderReplayed) != "" || strings.Contains(body, "payment") {
			t.Fatalf("POST /refunds was answered with the payment's response: %d %s", res.StatusCode, body)
		}
		if res.StatusCode != http.StatusUnprocessableEntity || codeOf(res, body) != "fingerprint_mismatch" {
			t.Fatalf("POST /refunds with the payment's key = %d %s, want 422 fingerprint_mismatch", res.StatusCode, body)
		}
		if n := refunds.n.Load(); n != 0 {
			t.Fatalf("the refund handler ran %d times under the payment's key", n)
		}
		again, againBody := send(t, srv.URL+"/payments", "k", `{"amount":100}`)
		if again.Header.Get(idempotency.HeaderReplayed) != "true" || againBody != firstBody || payments.n.Load() != 1 {
			t.Fatalf("the payment's record changed: replay %d %s, %d executions", again.StatusCode, againBody, payments.n.Load())
		}
	})
	t.Run("StripPrefix", func(t *testing.T) {
		store := newMemStore(t)
		v1, v2 := &named{name: "v1"}, &named{name: "v2"}
		mux := http.NewServeMux()
		mux.Handle("/v1/", http.StripPrefix("/v1", idempotency.New(store)(v1)))
		mux.Handle("/v2/", http.StripPrefix("/v2", idempotency.New(store)(v2)))
		srv := httptest.NewServer(mux)
		defer srv.Close()

		first, firstBody := send(t, srv.URL+"/v1/payments", "k", `{}`)
		if first.StatusCode != http.StatusCreated || firstBody != `{"v1":1}` {
			t.Fatalf("first v1 payment: %d %s", first.StatusCode, firstBody)
		}
		res, body := send(t, srv.URL+"/v2/payments", "k", `{}`)
		if res.Header.Get(idempotency.HeaderReplayed) != "" || strings.Contains(body, "v1") {
			t.Fatalf("POST /v2/payments was answered with v1's response: %d %s", res.StatusCode, body)
		}
		if res.StatusCode != http.StatusUnprocessableEntity || codeOf(res, body) != "fingerprint_mismatch" {
			t.Fatalf("POST /v2/payments with v1's key = %d %s, want 422 fingerprint_mismatch", res.StatusCode, body)
		}
		if n := v2.n.Load(); n != 0 {
			t.Fatalf("v2 ran %d times", n)
		}
		again, againBody := send(t, srv.URL+"/v1/payments", "k", `{}`)
		if again.Header.Get(idempotency.HeaderReplayed) != "true" || againBody != firstBody {
			t.Fatalf("v1's record changed: %d %s", again.StatusCode, againBody)
		}
		// A fresh key on v2 runs v2.
		if res, body := send(t, srv.URL+"/v2/payments", "k2", `{}`); res.StatusCode != http.StatusCreated || body != `{"v2":1}` {
			t.Fatalf("v2 with its own key: %d %s", res.StatusCode, body)
		}
	})
}

// TestEchoedHeadersStayWithinTheStoreBound: a handler that echoes a large
// request header into its response cannot take memstore past its byte
// bound, however many such responses complete at once; every request runs
// the handler once and every duplicate is answered by the record (marked
// when it could not be stored whole), never by a second execution.
func TestEchoedHeadersStayWithinTheStoreBound(t *testing.T) {
	const (
		requests = 300
		bound    = 8 << 20
	)
	big := strings.Repeat("x", 512<<10)
	store := memstore.New(memstore.WithMaxBytes(bound))
	defer store.Close()
	// Every handler waits until all requests have taken their records,
	// so that all of them complete at once, at the bound.
	var (
		runs    atomic.Int64
		mu      sync.Mutex
		arrived int
		all     = make(chan struct{})
	)
	arrive := func() {
		mu.Lock()
		defer mu.Unlock()
		if arrived++; arrived == requests {
			close(all)
		}
	}
	h := idempotency.New(store)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) <= requests {
			arrive()
			<-all
		}
		w.Header().Set("X-Trace", r.Header.Get("X-Trace"))
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "ok")
	}))
	serve := func(i int) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/echo", nil)
		req.Header.Set(idempotency.HeaderKey, fmt.Sprint("k", i))
		req.Header.Set("X-Trace", big)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}

	before := heapInUse()
	var wg sync.WaitGroup
	for i := range requests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if rec := serve(i); rec.Code != http.StatusCreated {
				t.Errorf("request %d: %d %s", i, rec.Code, rec.Body)
				arrive()
			}
		}()
	}
	wg.Wait()
	if grown := heapInUse() - before; grown > 3*bound {
		t.Fatalf("the heap grew by %.1f MiB for a store bounded at %d MiB", float64(grown)/(1<<20), bound>>20)
	}
	if n := runs.Load(); n != requests {
		t.Fatalf("the handler ran %d times for %d requests", n, requests)
	}
	for i := range requests {
		rec := serve(i)
		if rec.Code != http.StatusCreated || rec.Header().Get(idempotency.HeaderReplayed) != "true" {
			t.Fatalf("duplicate %d: %d %v", i, rec.Code, rec.Header())
		}
		if got := rec.Header().Get("X-Trace"); got != "" && got != big {
			t.Fatalf("duplicate %d replayed a different X-Trace of %d bytes", i, len(got))
		}
	}
	if n := runs.Load(); n != requests {
		t.Fatalf("duplicates ran the handler: %d executions", n)
	}
	// The bound was not spent on headers: an ordinary request still runs.
	if rec := serve(requests); rec.Code != http.StatusCreated || rec.Header().Get(idempotency.HeaderReplayed) != "" {
		t.Fatalf("an ordinary request after them: %d %s", rec.Code, rec.Body)
	}
}

// heapInUse returns the bytes of live heap objects after a collection.
func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// TestOuterHeadersAreTheirOwn: headers that middleware in front of the
// idempotency middleware set for the request (a request id, CORS) are
// neither stored with the response nor overwritten when a duplicate is
// answered: the outer middleware sets them afresh for each request, and
// the replay carries what the handler wrote.
func TestOuterHeadersAreTheirOwn(t *testing.T) {
	var n atomic.Int64
	outer := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Request-Id", fmt.Sprint("req-", n.Add(1)))
			if o := r.Header.Get("Origin"); o != "" {
				w.Header().Set("Access-Control-Allow-Origin", o)
				w.Header().Add("Vary", "Origin")
			}
			next.ServeHTTP(w, r)
		})
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/payments/1")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":1}`)
	})
	srv := httptest.NewServer(outer(idempotency.New(newMemStore(t))(handler)))
	defer srv.Close()

	first, _ := send(t, srv.URL+"/payments", "k", `{}`, "Origin", "https://a.example")
	if first.Header.Get("X-Request-Id") != "req-1" || first.Header.Get("Access-Control-Allow-Origin") != "https://a.example" {
		t.Fatalf("first response: %v", first.Header)
	}
	send(t, srv.URL+"/payments", "k", `{}`) // req-2: no Origin
	third, body := send(t, srv.URL+"/payments", "k", `{}`, "Origin", "https://evil.example")
	if third.Header.Get(idempotency.HeaderReplayed) != "true" || body != `{"id":1}` {
		t.Fatalf("third request not replayed: %d %v %s", third.StatusCode, third.Header, body)
	}
	if got := third.Header.Values("X-Request-Id"); len(got) != 1 || got[0] != "req-3" {
		t.Errorf("replay's X-Request-Id = %q, want [req-3] (the outer middleware's, for this request)", got)
	}
	if got := third.Header.Values("Access-Control-Allow-Origin"); len(got) != 1 || got[0] != "https://evil.example" {
		t.Errorf("replay's Access-Control-Allow-Origin = %q, want what the outer middleware set for this request", got)
	}
	if got := third.Header.Values("Vary"); len(got) != 1 {
		t.Errorf("replay's Vary = %q, want the outer middleware's one value", got)
	}
	if third.Header.Get("Location") != "/payments/1" || third.Header.Get("Content-Type") != "application/json" {
		t.Errorf("replay lost the handler's headers: %v", third.Header)
	}
	second, _ := send(t, srv.URL+"/payments", "k", `{}`)
	if v := second.Header.Get("Access-Control-Allow-Origin"); v != "" {
		t.Errorf("a replay to a request without Origin carries Access-Control-Allow-Origin %q", v)
	}
}

// optionalAuth puts the user named by a bearer token in the request's
// context, as authenticate does, but lets a request without a known token
// go on without a user.
func optionalAuth(next http.Handler) http.Handler {
	users := map[string]string{"Bearer alice-token": "alice", "Bearer bob-token": "bob"}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, ok := users[r.Header.Get("Authorization")]; ok {
			r = r.WithContext(context.WithValue(r.Context(), userKey{}, u))
		}
		next.ServeHTTP(w, r)
	})
}

// TestNoPrincipalNoSharedKeys: a request for which the scope function finds
// no principal is refused with a problem, and never reads or writes the
// key space that every request without a principal would share.
func TestNoPrincipalNoSharedKeys(t *testing.T) {
	h := &counter{}
	srv := httptest.NewServer(optionalAuth(idempotency.New(newMemStore(t), idempotency.WithKeyScope(userOf))(h)))
	defer srv.Close()

	alice, aliceBody := send(t, srv.URL+"/payments", "k", `{}`, "Authorization", "Bearer alice-token")
	if alice.StatusCode != http.StatusCreated {
		t.Fatalf("alice: %d %s", alice.StatusCode, aliceBody)
	}
	for i := range 2 {
		res, body := send(t, srv.URL+"/payments", "shared", `{}`)
		if res.StatusCode != http.StatusForbidden || codeOf(res, body) != "scope_missing" {
			t.Fatalf("anonymous request %d with a key = %d %s, want 403 scope_missing", i, res.StatusCode, body)
		}
	}
	if n := h.n.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want once (alice)", n)
	}
	// Without a key the request is not the middleware's to refuse.
	if res, body := send(t, srv.URL+"/payments", "", `{}`); res.StatusCode != http.StatusCreated {
		t.Fatalf("anonymous request without a key: %d %s", res.StatusCode, body)
	}
	bob, bobBody := send(t, srv.URL+"/payments", "k", `{}`, "Authorization", "Bearer bob-token")
	if bob.Header.Get(idempotency.HeaderReplayed) != "" || bobBody == aliceBody {
		t.Fatalf("bob got alice's replay: %s", bobBody)
	}
}

// TestReplaySendsOnlyWhatIsStorable: a record that holds what the writer
// would never have stored (a foreign or tampered record: Set-Cookie without
// WithStoreSetCookie, hop-by-hop headers, Transfer-Encoding, Date, a
// Content-Length that disagrees with the body) is replayed without those
// headers and with the body's own length.
func TestReplaySendsOnlyWhatIsStorable(t *testing.T) {
	forged := &idempotency.Response{
		Status: http.StatusCreated,
		Header: http.Header{
			"Set-Cookie":        {"sid=alice-session"},
			"Connection":        {"close, X-Hop"},
			"X-Hop":             {"1"},
			"Keep-Alive":        {"timeout=5"},
			"Transfer-Encoding": {"chunked"},
			"Date":              {"Mon, 01 Jan 2024 00:00:00 GMT"},
			"Content-Length":    {"100000"},
			"Content-Type":      {"application/json"},
		},
		Body: []byte(`{"forged":true}`),
	}
	h := &counter{}
	store := &forgingStore{Store: newMemStore(t), resp: forged}
	srv := httptest.NewServer(idempotency.New(store)(h))
	defer srv.Close()

	send(t, srv.URL+"/payments", "k", `{}`)
	res, body := send(t, srv.URL+"/payments", "k", `{}`)
	if res.Header.Get(idempotency.HeaderReplayed) != "true" || body != `{"forged":true}` {
		t.Fatalf("not replayed: %d %v %s", res.StatusCode, res.Header, body)
	}
	for _, k := range []string{"Set-Cookie", "Keep-Alive", "X-Hop"} {
		if v := res.Header.Get(k); v != "" {
			t.Errorf("replay sent %s: %q", k, v)
		}
	}
	if res.Close || len(res.TransferEncoding) != 0 {
		t.Errorf("replay sent the record's connection headers: close=%v transfer-encoding=%v", res.Close, res.TransferEncoding)
	}
	if res.ContentLength != int64(len(body)) {
		t.Errorf("replay's Content-Length = %d for a body of %d bytes", res.ContentLength, len(body))
	}
	if res.Header.Get("Date") == "Mon, 01 Jan 2024 00:00:00 GMT" {
		t.Errorf("replay sent the record's Date")
	}
	if res.Header.Get("Content-Type") != "application/json" {
		t.Errorf("replay lost Content-Type: %v", res.Header)
	}
}

// forgingStore answers every replay with resp instead of the stored
// response, as a store holding a tampered or foreign record would.
type forgingStore struct {
	idempotency.Store
	resp *idempotency.Response
}

func (s *forgingStore) Acquire(ctx context.Context, req idempotency.AcquireRequest) (idempotency.Acquisition, error) {
	a, err := s.Store.Acquire(ctx, req)
	if err == nil && a.Outcome == idempotency.Completed {
		a.Response = s.resp
	}
	return a, err
}

// TestUnscopedKeysOptIn: WithUnscopedKeys lets requests without a principal
// share one key space, which principals' keys never meet.
func TestUnscopedKeysOptIn(t *testing.T) {
	h := &counter{}
	mw := idempotency.New(newMemStore(t), idempotency.WithKeyScope(userOf), idempotency.WithUnscopedKeys(true))
	srv := httptest.NewServer(optionalAuth(mw(h)))
	defer srv.Close()

	first, firstBody := send(t, srv.URL+"/orders", "k", `{}`)
	again, againBody := send(t, srv.URL+"/orders", "k", `{}`)
	if first.StatusCode != http.StatusCreated || again.Header.Get(idempotency.HeaderReplayed) != "true" || againBody != firstBody {
		t.Fatalf("anonymous requests: %d %s, then %d %s", first.StatusCode, firstBody, again.StatusCode, againBody)
	}
	alice, aliceBody := send(t, srv.URL+"/orders", "k", `{}`, "Authorization", "Bearer alice-token")
	if alice.Header.Get(idempotency.HeaderReplayed) != "" || aliceBody == firstBody {
		t.Fatalf("alice got the anonymous record: %s", aliceBody)
	}
	if n := h.n.Load(); n != 2 {
		t.Fatalf("%d executions, want 2", n)
	}
}

// TestHeadersOverTheirCap: a response whose stored headers are over
// WithMaxResponseHeader reaches its client whole; its duplicates get the
// status alone, marked, and the handler runs once. On a transactional
// route, such a response rolls everything back instead.
func TestHeadersOverTheirCap(t *testing.T) {
	var runs atomic.Int64
	h := idempotency.New(newMemStore(t), idempotency.WithMaxResponseHeader(100))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("X-Big", strings.Repeat("b", 200))
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "made")
	}))
	first := do(h, http.MethodPost, "k", "")
	if first.Header.Get("X-Big") == "" || readAll(t, first) != "made" {
		t.Fatalf("first client: %v", first.Header)
	}
	dup := do(h, http.MethodPost, "k", "")
	switch {
	case dup.StatusCode != http.StatusCreated || dup.Header.Get(idempotency.HeaderReplayed) != "true":
		t.Fatalf("duplicate: %d %v", dup.StatusCode, dup.Header)
	case dup.Header.Get(idempotency.HeaderHeaderOmitted) != "true" || dup.Header.Get(idempotency.HeaderBodyOmitted) != "true":
		t.Fatalf("duplicate lacks the markers: %v", dup.Header)
	case dup.Header.Get("X-Big") != "" || dup.Header.Get("Content-Type") != "":
		t.Fatalf("duplicate carries the headers that were not stored: %v", dup.Header)
	case readAll(t, dup) != "":
		t.Fatal("duplicate has a body")
	case runs.Load() != 1:
		t.Fatalf("%d executions", runs.Load())
	}
	// Headers under the cap are stored as before.
	small := idempotency.New(newMemStore(t), idempotency.WithMaxResponseHeader(1000))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Big", strings.Repeat("b", 200))
		w.WriteHeader(http.StatusCreated)
	}))
	do(small, http.MethodPost, "k", "")
	if dup := do(small, http.MethodPost, "k", ""); dup.Header.Get("X-Big") == "" || dup.Header.Get(idempotency.HeaderHeaderOmitted) != "" {
		t.Fatalf("headers under the cap: %v", dup.Header)
	}
}

// TestStoredHeadersAllowList: WithStoredHeaders keeps only the names it
// lists, in any case.
func TestStoredHeadersAllowList(t *testing.T) {
	h := idempotency.New(newMemStore(t), idempotency.WithStoredHeaders("content-type", "Location"))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/p/1")
		w.Header().Set("X-Debug", "internal")
		w.WriteHeader(http.StatusCreated)
	}))
	first := do(h, http.MethodPost, "k", "")
	if first.Header.Get("X-Debug") != "internal" {
		t.Fatalf("the first client lost a header: %v", first.Header)
	}
	dup := do(h, http.MethodPost, "k", "")
	if dup.Header.Get("X-Debug") != "" || dup.Header.Get("Location") != "/p/1" || dup.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("replay headers %v, want Content-Type and Location only", dup.Header)
	}
}

// TestHandlerChangesAnOuterHeader: a header that the outer middleware set
// and the handler changed is the handler's, and its replay carries it.
func TestHandlerChangesAnOuterHeader(t *testing.T) {
	outer := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json") // the API's default
			w.Header().Set("Cache-Control", "no-store")
			next.ServeHTTP(w, r)
		})
	}
	h := outer(idempotency.New(newMemStore(t))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/csv")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "a,b\n")
	})))
	do(h, http.MethodPost, "k", "")
	dup := do(h, http.MethodPost, "k", "")
	if got := dup.Header.Values("Content-Type"); len(got) != 1 || got[0] != "text/csv" {
		t.Fatalf("replay's Content-Type = %q, want the handler's text/csv", got)
	}
	if got := dup.Header.Values("Cache-Control"); len(got) != 1 || got[0] != "no-store" {
		t.Fatalf("replay's Cache-Control = %q, want the outer middleware's one value", got)
	}
}
