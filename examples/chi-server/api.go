package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/pgstore"
)

// payment is the resource the API creates.
type payment struct {
	ID       string    `json:"id"`
	User     string    `json:"user"`
	Amount   int64     `json:"amount"`
	Currency string    `json:"currency"`
	Created  time.Time `json:"created"`
}

// api serves the payments. Without a database it keeps them in memory;
// with one (PostgreSQL mode) each payment is a row of the payments table,
// written in the request's transaction.
type api struct {
	store  idempotency.Store
	db     *pgxpool.Pool // PostgreSQL mode; nil otherwise
	logger *slog.Logger
	// events, in PostgreSQL mode, makes each payment enqueue a
	// payment.created message in its transaction.
	events bool

	mu       sync.Mutex
	payments map[string]payment // without db
	executed atomic.Int64       // without db: payments made
}

// newAPI returns the API over store; db, when not nil, is the database of
// a pgstore.Store, which then also holds the payments.
func newAPI(store idempotency.Store, db *pgxpool.Pool, logger *slog.Logger) *api {
	return &api{store: store, db: db, logger: logger, payments: map[string]payment{}}
}

func (a *api) routes() http.Handler {
	r := chi.NewRouter()
	r.Use(middleware.Recoverer)
	r.Get("/stats", a.stats)

	r.Group(func(r chi.Router) {
		// Authentication runs before the idempotency middleware, whose
		// scope is the user it verified: each user's keys are their own,
		// whatever headers the client sends.
		r.Use(authenticate)
		// Keys are scoped per user, required on POST, and kept for an hour
		// on this route.
		opts := []idempotency.Option{
			idempotency.WithKeyRequired(true),
			idempotency.WithKeyScope(user),
			idempotency.WithTTL(time.Hour),
			idempotency.WithLogger(a.logger),
			idempotency.WithRoute(func(r *http.Request) string { return chi.RouteContext(r.Context()).RoutePattern() }),
		}
		create := a.createPayment
		if a.db != nil {
			// The payment's row and the key's record commit together, in
			// the request's transaction.
			opts = append(opts, idempotency.WithTransaction(true))
			create = a.createPaymentTx
		}
		r.With(idempotency.New(a.store, opts...)).Post("/payments", create)
		r.Get("/payments/{id}", a.getPayment)
	})
	return r
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// serverError answers status, a 5xx, with the message public, and logs
// why with err: the client learns that the call failed, the log what
// failed. (The middleware logs its own 5xx answers: idempotency.WithLogger.)
func (a *api) serverError(w http.ResponseWriter, r *http.Request, status int, public string, err error) {
	a.logger.ErrorContext(r.Context(), public, "status", status, "method", r.Method, "path", r.URL.Path, "user", user(r), "error", err)
	writeJSON(w, status, map[string]string{"error": public})
}

// readPayment decodes the request's payment, or answers 400.
func readPayment(w http.ResponseWriter, r *http.Request) (payment, bool) {
	var in struct {
		Amount   int64  `json:"amount"`
		Currency string `json:"currency"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Amount <= 0 || len(in.Currency) != 3 {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": `want {"amount": >0, "currency": "EUR"}`})
		return payment{}, false
	}
	return payment{User: user(r), Amount: in.Amount, Currency: in.Currency}, true
}

// errProviderDown is the payment provider's failure that ?provider=down
// stands for.
var errProviderDown = errors.New("the payment provider did not answer (?provider=down)")

// charge stands for the call to the payment provider. ?delay=3s makes it
// slow (at most 10s), ?provider=down makes it fail. When it fails it
// answers a 5xx, which releases the key (the client's retry runs again),
// logs why, and returns false.
func (a *api) charge(w http.ResponseWriter, r *http.Request) bool {
	if d, err := time.ParseDuration(r.URL.Query().Get("delay")); err == nil && d > 0 {
		select {
		case <-time.After(min(d, 10*time.Second)):
		case <-r.Context().Done():
			a.serverError(w, r, http.StatusServiceUnavailable, "cancelled", context.Cause(r.Context()))
			return false
		}
	}
	if r.URL.Query().Get("provider") == "down" {
		a.serverError(w, r, http.StatusBadGateway, "payment provider unavailable", errProviderDown)
		return false
	}
	return true
}

// createPayment makes a payment kept in memory.
func (a *api) createPayment(w http.ResponseWriter, r *http.Request) {
	p, ok := readPayment(w, r)
	if !ok || !a.charge(w, r) {
		return
	}
	a.executed.Add(1)
	var id [8]byte
	_, _ = rand.Read(id[:])
	p.ID, p.Created = "pay_"+hex.EncodeToString(id[:]), time.Now().UTC()
	a.mu.Lock()
	a.payments[p.ID] = p
	a.mu.Unlock()
	w.Header().Set("Location", "/payments/"+p.ID)
	writeJSON(w, http.StatusCreated, p)
}

// createPaymentTx makes a payment in PostgreSQL mode: it inserts the row
// in the request's transaction, which the middleware commits together
// with the key's record once the handler has answered. The provider is
// called after the INSERT: when it fails, the 5xx rolls the transaction
// back, row included.
func (a *api) createPaymentTx(w http.ResponseWriter, r *http.Request) {
	p, ok := readPayment(w, r)
	if !ok {
		return
	}
	info, _ := idempotency.FromContext(r.Context())
	tx, ok := pgstore.TxFromContext(r.Context())
	if !ok {
		a.serverError(w, r, http.StatusInternalServerError, "no transaction",
			errors.New("the route has no transaction: its middleware needs idempotency.WithTransaction(true) on a pgstore.Store"))
		return
	}
	var id int64
	err := tx.QueryRow(r.Context(),
		`INSERT INTO payments (user_name, idempotency_key, amount, currency) VALUES ($1, $2, $3, $4) RETURNING id, created`,
		p.User, info.Key, p.Amount, p.Currency).Scan(&id, &p.Created)
	if err != nil {
		a.serverError(w, r, http.StatusInternalServerError, "payment not recorded", fmt.Errorf("inserting a payment: %w", err))
		return
	}
	if !a.charge(w, r) {
		return
	}
	p.ID, p.Created = paymentID(id), p.Created.UTC()
	if a.events {
		if err := enqueueCreated(r.Context(), p); err != nil {
			a.serverError(w, r, http.StatusInternalServerError, "payment not recorded", fmt.Errorf("enqueueing payment.created: %w", err))
			return
		}
	}
	w.Header().Set("Location", "/payments/"+p.ID)
	writeJSON(w, http.StatusCreated, p)
}

// topicPaymentCreated is the topic of the message each payment enqueues
// when events are on: the NATS subject the relay publishes it on.
const topicPaymentCreated = "payment.created"

// enqueueCreated adds payment.created for p to the outbox, in the
// request's transaction: the message commits with the payment's row and
// the key's record, or not at all. Its ID, which the relay sends as
// Nats-Msg-Id, derives from the record, so a retried request makes no
// second message.
func enqueueCreated(ctx context.Context, p payment) error {
	body, err := json.Marshal(p)
	if err != nil {
		return err
	}
	_, err = outbox.Enqueue(ctx, outbox.Message{
		Topic:   topicPaymentCreated,
		Payload: body,
		Headers: map[string]string{"Content-Type": "application/json"},
	})
	return err
}

// paymentID is the API's name of the payments row id.
func paymentID(id int64) string { return "pay_" + strconv.FormatInt(id, 10) }

func (a *api) getPayment(w http.ResponseWriter, r *http.Request) {
	p, found, err := a.lookup(r.Context(), chi.URLParam(r, "id"))
	if err != nil {
		a.serverError(w, r, http.StatusInternalServerError, "payment not readable", fmt.Errorf("reading a payment: %w", err))
		return
	}
	if !found || p.User != user(r) {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such payment"})
		return
	}
	writeJSON(w, http.StatusOK, p)
}

// lookup returns the payment called id, from memory or, in PostgreSQL
// mode, from its row.
func (a *api) lookup(ctx context.Context, id string) (payment, bool, error) {
	if a.db == nil {
		a.mu.Lock()
		defer a.mu.Unlock()
		p, ok := a.payments[id]
		return p, ok, nil
	}
	digits, ok := strings.CutPrefix(id, "pay_")
	n, err := strconv.ParseInt(digits, 10, 64)
	if !ok || err != nil {
		return payment{}, false, nil
	}
	p := payment{ID: id}
	err = a.db.QueryRow(ctx, `SELECT user_name, amount, currency, created FROM payments WHERE id = $1`, n).
		Scan(&p.User, &p.Amount, &p.Currency, &p.Created)
	if errors.Is(err, pgx.ErrNoRows) {
		return payment{}, false, nil
	}
	p.Created = p.Created.UTC()
	return p, err == nil, err
}

// stats answers how many payments were made: in PostgreSQL mode the rows
// of the payments table, which a transaction rolled back did not add.
func (a *api) stats(w http.ResponseWriter, r *http.Request) {
	n := a.executed.Load()
	if a.db != nil {
		if err := a.db.QueryRow(r.Context(), `SELECT count(*) FROM payments`).Scan(&n); err != nil {
			a.serverError(w, r, http.StatusInternalServerError, "payments not countable", fmt.Errorf("counting payments: %w", err))
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]int64{"payments_executed": n})
}
