package state_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/pgstore"
	"github.com/go-idempotency/idempotency/state"
)

var ctx = context.Background()

// TestProblemFor: each error of the package has its status, code and
// members; anything else has no problem.
func TestProblemFor(t *testing.T) {
	cur := state.Record{Ref: state.Ref{Scope: "acme", Machine: "payments.payment", ID: "pay_1"}, State: "captured", Version: 2}
	cases := []struct {
		err    error
		status int
		code   string
		check  func(p *state.Problem) bool
	}{
		{&state.ConflictError{Reason: state.ReasonVersion, Current: cur, Change: state.Change{From: "authorized", To: "canceled", ExpectedVersion: 1}},
			409, state.CodeConflict, func(p *state.Problem) bool {
				return p.State == "captured" && p.Version == 2 && p.Reason == "version" && p.Machine == "payments.payment" && p.ID == "pay_1"
			}},
		{&state.ExistsError{Current: cur}, 409, state.CodeExists, func(p *state.Problem) bool { return p.State == "captured" && p.Version == 2 }},
		{&state.NotFoundError{Ref: cur.Ref}, 404, state.CodeNotFound, func(p *state.Problem) bool { return p.ID == "pay_1" && p.State == "" }},
		{&state.InvalidArgumentError{Field: "machine", Reason: "bad"}, 422, state.CodeInvalidArgument, func(p *state.Problem) bool { return p.Field == "machine" }},
		{&state.StoreError{Op: "transition", Err: errors.New("conn refused: secret host")}, 503, state.CodeStoreError, func(p *state.Problem) bool {
			return p.RetryAfter > 0 && !strings.Contains(p.Detail, "secret")
		}},
	}
	for _, c := range cases {
		wrapped := errors.Join(errors.New("capture"), c.err)
		p := state.ProblemFor(wrapped)
		if p == nil || p.Status != c.status || string(p.Code) != c.code || p.Type != idempotency.ProblemTypeBase+c.code || p.Title == "" || !c.check(p) {
			t.Errorf("ProblemFor(%T) = %+v", c.err, p)
		}
	}
	if p := state.ProblemFor(errors.New("other")); p != nil {
		t.Errorf("ProblemFor(another error) = %+v", p)
	}
}

// TestWriteError: the problem's document, its headers, and a 500 without
// the text of an error that is none of the package's.
func TestWriteError(t *testing.T) {
	rec := httptest.NewRecorder()
	cur := state.Record{Ref: state.Ref{Scope: "acme", Machine: "payments.payment", ID: "pay_1"}, State: "captured", Version: 2}
	state.WriteError(rec, httptest.NewRequest("POST", "/", nil), &state.ConflictError{Reason: state.ReasonState, Current: cur, Change: state.Change{From: "authorized", ExpectedVersion: 2}})
	var doc map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if rec.Code != 409 || rec.Header().Get("Content-Type") != "application/problem+json" || doc["code"] != "state_conflict" ||
		doc["state"] != "captured" || doc["version"] != 2.0 || doc["reason"] != "state" || doc["status"] != 409.0 || doc["scope"] != nil {
		t.Errorf("conflict: %d %v %s", rec.Code, rec.Header(), rec.Body)
	}

	rec = httptest.NewRecorder()
	state.WriteError(rec, httptest.NewRequest("POST", "/", nil), &state.StoreError{Op: "get", Err: errors.New("x")})
	if rec.Code != 503 || rec.Header().Get("Retry-After") != "1" {
		t.Errorf("store error: %d, Retry-After %q", rec.Code, rec.Header().Get("Retry-After"))
	}

	rec = httptest.NewRecorder()
	state.WriteError(rec, httptest.NewRequest("POST", "/", nil), errors.New("password=hunter2"))
	if rec.Code != 500 || strings.Contains(rec.Body.String(), "hunter2") || !strings.Contains(rec.Body.String(), state.CodeInternal) {
		t.Errorf("another error: %d %s", rec.Code, rec.Body)
	}
}

// TestRoute: on a transactional route of the middleware, a capture and a
// cancel with two keys: the second is answered 409 with the record the
// first left, and its duplicate is that answer replayed. A store error is
// answered 503, which releases the key: a retry runs again.
func TestRoute(t *testing.T) {
	pool := pgtest.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 8 })
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	store := pgstore.New(pool)
	t.Cleanup(func() { store.Close() })
	payments := state.New(pool)
	broken := state.New(pool, state.WithTable("no_such_table"))
	ref := state.Ref{Scope: "acme", Machine: "payments.payment", ID: "pay_1"}
	if _, err := payments.Create(ctx, ref, "authorized", nil); err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	mux := http.NewServeMux()
	move := func(s *state.Store, to string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			rec, err := s.Transition(r.Context(), ref, state.Change{From: "authorized", To: to, ExpectedVersion: 1})
			if err != nil {
				state.WriteError(w, r, err)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(rec)
		}
	}
	mux.Handle("POST /capture", move(payments, "captured"))
	mux.Handle("POST /cancel", move(payments, "canceled"))
	mux.Handle("POST /broken", move(broken, "canceled"))
	srv := httptest.NewServer(idempotency.New(store, idempotency.WithTransaction(true))(mux))
	t.Cleanup(srv.Close)

	post := func(path, key string) (int, string, http.Header) {
		t.Helper()
		req, _ := http.NewRequest("POST", srv.URL+path, nil)
		req.Header.Set("Idempotency-Key", key)
		res, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(body), res.Header
	}
	if code, body, _ := post("/capture", "k-capture"); code != 200 {
		t.Fatalf("capture: %d %s", code, body)
	}
	code, body, _ := post("/cancel", "k-cancel")
	var p state.Problem
	if err := json.Unmarshal([]byte(body), &p); err != nil || code != 409 || p.Code != state.CodeConflict || p.State != "captured" || p.Version != 2 {
		t.Fatalf("cancel after capture: %d %s (%v)", code, body, err)
	}
	again, againBody, h := post("/cancel", "k-cancel")
	if again != code || againBody != body || h.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the cancel's duplicate: %d %s replayed=%q; want %d %s replayed", again, againBody, h.Get("Idempotent-Replayed"), code, body)
	}
	if n := runs.Load(); n != 2 {
		t.Errorf("the handlers ran %d times, want 2", n)
	}
	for i := range 2 {
		code, body, h := post("/broken", "k-broken")
		if code != 503 || h.Get("Idempotent-Replayed") != "" || !strings.Contains(body, state.CodeStoreError) {
			t.Errorf("broken, call %d: %d %s", i, code, body)
		}
	}
	if n := runs.Load(); n != 4 {
		t.Errorf("the handlers ran %d times, want 4: a store error releases the key", n)
	}
	h2, err := payments.History(ctx, ref, 0, 0)
	if err != nil || len(h2) != 1 || h2[0].To != "captured" || h2[0].Cause.Key != "k-capture" || h2[0].Cause.Epoch != 1 {
		t.Errorf("history %+v, %v; want the capture alone, caused by its key", h2, err)
	}
}
