package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/go-idempotency/idempotency"
)

// payment is the resource the API creates.
type payment struct {
	ID       string    `json:"id"`
	User     string    `json:"user"`
	Amount   int64     `json:"amount"`
	Currency string    `json:"currency"`
	Created  time.Time `json:"created"`
}

type api struct {
	store  idempotency.Store
	logger *slog.Logger

	mu       sync.Mutex
	payments map[string]payment
	executed atomic.Int64
}

func newAPI(store idempotency.Store, logger *slog.Logger) *api {
	return &api{store: store, logger: logger, payments: map[string]payment{}}
}

// user is the demo's authentication: the principal comes from X-User, or
// from a bearer token taken as the user name.
func user(r *http.Request) string {
	if u := r.Header.Get("X-User"); u != "" {
		return u
	}
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return tok
	}
	return ""
}

func requireUser(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if user(r) == "" {
			http.Error(w, "send X-User or Authorization: Bearer <user>", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (a *api) routes() http.Handler {
	r := chi.NewRouter()
	r.Use(middleware.Recoverer)
	r.Get("/stats", a.stats)

	r.Group(func(r chi.Router) {
		r.Use(requireUser)
		// Keys are scoped per user, required on POST, and kept for an hour
		// on this route.
		idem := idempotency.New(a.store,
			idempotency.WithKeyRequired(true),
			idempotency.WithKeyScope(user),
			idempotency.WithTTL(time.Hour),
			idempotency.WithLogger(a.logger),
			idempotency.WithRoute(func(r *http.Request) string { return chi.RouteContext(r.Context()).RoutePattern() }),
		)
		r.With(idem).Post("/payments", a.createPayment)
		r.Get("/payments/{id}", a.getPayment)
	})
	return r
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (a *api) createPayment(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Amount   int64  `json:"amount"`
		Currency string `json:"currency"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Amount <= 0 || len(in.Currency) != 3 {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": `want {"amount": >0, "currency": "EUR"}`})
		return
	}
	// ?delay=3s simulates a slow payment provider (at most 10s).
	if d, err := time.ParseDuration(r.URL.Query().Get("delay")); err == nil && d > 0 {
		select {
		case <-time.After(min(d, 10*time.Second)):
		case <-r.Context().Done():
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "cancelled"})
			return
		}
	}
	a.executed.Add(1)
	var id [8]byte
	_, _ = rand.Read(id[:])
	p := payment{ID: "pay_" + hex.EncodeToString(id[:]), User: user(r), Amount: in.Amount, Currency: in.Currency, Created: time.Now().UTC()}
	a.mu.Lock()
	a.payments[p.ID] = p
	a.mu.Unlock()
	w.Header().Set("Location", "/payments/"+p.ID)
	writeJSON(w, http.StatusCreated, p)
}

func (a *api) getPayment(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	p, ok := a.payments[chi.URLParam(r, "id")]
	a.mu.Unlock()
	if !ok || p.User != user(r) {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such payment"})
		return
	}
	writeJSON(w, http.StatusOK, p)
}

func (a *api) stats(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]int64{"payments_executed": a.executed.Load()})
}
