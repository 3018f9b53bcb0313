package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/memstore"
)

// paymentsAPI is the chi-server's API without any idempotency: every POST
// /payments executes.
func paymentsAPI(executed *atomic.Int64) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments", func(w http.ResponseWriter, r *http.Request) {
		var p payment
		if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		p.ID = fmt.Sprintf("pay_%d", executed.Add(1))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(p)
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]int64{"payments_executed": executed.Load()})
	})
	return mux
}

func TestProxyLosesAnswersAfterExecution(t *testing.T) {
	var executed atomic.Int64
	srv := httptest.NewServer(paymentsAPI(&executed))
	t.Cleanup(srv.Close)
	proxy, err := startFlakyProxy(strings.TrimPrefix(srv.URL, "http://"), 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })

	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Post("http://"+proxy.Addr()+"/payments", "application/json", strings.NewReader(`{"amount":1,"currency":"EUR"}`))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got %s, want the answer lost", resp.Status)
	}
	if executed.Load() != 1 || proxy.Dropped() != 1 {
		t.Errorf("executed %d, dropped %d; want 1, 1", executed.Load(), proxy.Dropped())
	}
}

func TestProxyRelaysWhenNotDropping(t *testing.T) {
	var executed atomic.Int64
	srv := httptest.NewServer(paymentsAPI(&executed))
	t.Cleanup(srv.Close)
	proxy, err := startFlakyProxy(strings.TrimPrefix(srv.URL, "http://"), 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	for range 3 {
		resp, err := http.Get("http://" + proxy.Addr() + "/stats")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), `"payments_executed":0`) {
			t.Errorf("body %q", b)
		}
	}
	if proxy.Dropped() != 0 {
		t.Errorf("dropped %d", proxy.Dropped())
	}
}

// tokens is examples/chi-server's table of bearer tokens and their users.
var tokens = map[string]string{"alice-token": "alice", "bob-token": "bob"}

type userKey struct{}

// authenticate is examples/chi-server's authentication: it verifies the
// bearer token and puts its user in the request's context, or answers 401.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		u, known := tokens[token]
		if !ok || !known {
			w.Header().Set("WWW-Authenticate", "Bearer")
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, u)))
	})
}

// payers counts the payments executed per user.
type payers struct {
	mu sync.Mutex
	n  map[string]int
}

func (p *payers) add(user string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n == nil {
		p.n = map[string]int{}
	}
	p.n[user]++
}

// counts returns a copy of the counts.
func (p *payers) counts() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.n)
}

// protected wraps paymentsAPI's POST /payments in authentication and the
// middleware, configured as examples/chi-server does: keys are scoped to
// the authenticated user, and paid counts each user's payments.
func protected(t *testing.T, executed *atomic.Int64, paid *payers) http.Handler {
	store := memstore.New()
	t.Cleanup(func() { store.Close() })
	idem := idempotency.New(store,
		idempotency.WithKeyRequired(true),
		idempotency.WithKeyScope(func(r *http.Request) string {
			u, _ := r.Context().Value(userKey{}).(string)
			return u
		}),
	)
	api := paymentsAPI(executed)
	count := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paid.add(r.Context().Value(userKey{}).(string))
		api.ServeHTTP(w, r)
	})
	pay := authenticate(idem(count))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			pay.ServeHTTP(w, r)
			return
		}
		api.ServeHTTP(w, r)
	})
}

func TestExactlyOnceThroughLostAnswers(t *testing.T) {
	var executed atomic.Int64
	var paid payers
	srv := httptest.NewServer(protected(t, &executed, &paid))
	t.Cleanup(srv.Close)
	var out strings.Builder
	err := run(context.Background(), []string{"-server", srv.URL, "-n", "12", "-drop", "0.5", "-seed", "3", "-token", "bob-token"}, &out)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "server executed 12 payments for 12 sent") || executed.Load() != 12 {
		t.Errorf("executed %d; output:\n%s", executed.Load(), out.String())
	}
	if n := paid.counts(); len(n) != 1 || n["bob"] != 12 {
		t.Errorf("payments per user %v, want bob's 12", n)
	}
	if !strings.Contains(out.String(), "yes") || strings.Contains(out.String(), " 0 answers lost") {
		t.Errorf("no answer was lost and replayed; output:\n%s", out.String())
	}
}

// Against a server that ignores the key, lost answers lead to duplicate
// executions, and the example must say so and fail.
func TestDetectsDuplicateExecutions(t *testing.T) {
	var executed atomic.Int64
	srv := httptest.NewServer(paymentsAPI(&executed))
	t.Cleanup(srv.Close)
	var out strings.Builder
	err := run(context.Background(), []string{"-server", srv.URL, "-n", "10", "-drop", "0.5", "-seed", "7"}, &out)
	if err == nil || !strings.Contains(err.Error(), "for 10 sent") {
		t.Fatalf("err = %v, want a mismatch; output:\n%s", err, out.String())
	}
	if executed.Load() <= 10 {
		t.Errorf("executed %d, want duplicates", executed.Load())
	}
}

// A token the server does not know is refused, on every payment, before
// anything runs.
func TestUnknownTokenRefused(t *testing.T) {
	var executed atomic.Int64
	var paid payers
	srv := httptest.NewServer(protected(t, &executed, &paid))
	t.Cleanup(srv.Close)
	var out strings.Builder
	err := run(context.Background(), []string{"-server", srv.URL, "-n", "3", "-drop", "0", "-token", "alice"}, &out)
	if err == nil || !strings.Contains(out.String(), "401 Unauthorized") {
		t.Fatalf("err = %v, want 401s; output:\n%s", err, out.String())
	}
	if n := paid.counts(); executed.Load() != 0 || len(n) != 0 {
		t.Errorf("executed %d (%v) with an unknown token", executed.Load(), n)
	}
}

func TestNoLossNoRetry(t *testing.T) {
	var executed atomic.Int64
	srv := httptest.NewServer(paymentsAPI(&executed))
	t.Cleanup(srv.Close)
	var out strings.Builder
	if err := run(context.Background(), []string{"-server", srv.URL + "/", "-n", "3", "-drop", "0"}, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "server executed 3 payments for 3 sent") {
		t.Errorf("output:\n%s", out.String())
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-n", "0"},
		{"-drop", "1"},
		{"-drop", "-0.1"},
		{"-attempts", "0"},
		{"-timeout", "0s"},
		{"-token", ""},
		{"-server", "https://127.0.0.1:1"},
		{"-server", "::"},
		{"extra"},
		{"-nope"},
	} {
		if err := run(context.Background(), args, io.Discard); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
}
