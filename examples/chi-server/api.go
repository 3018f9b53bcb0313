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

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/state"
)

// payment is the resource the API creates.
type payment struct {
	ID       string    `json:"id"`
	User     string    `json:"user"`
	Amount   int64     `json:"amount"`
	Currency string    `json:"currency"`
	Created  time.Time `json:"created"`
	// Status is, in PostgreSQL and SQLite modes, authorized (its capture
	// scheduled), captured or canceled.
	Status string `json:"status,omitempty"`
	// CaptureAt is when an authorized payment is to be captured, or when a
	// captured one was.
	CaptureAt *time.Time `json:"capture_at,omitempty"`
	// State and Version are, in PostgreSQL and SQLite modes, those of the
	// payment's state record (see states.go): the version is what a client
	// sends back as If-Match to capture or cancel the payment as it saw it.
	State   string `json:"state,omitempty"`
	Version int64  `json:"version,omitempty"`
}

// api serves the payments. Without a database it keeps them in memory;
// with one (PostgreSQL or SQLite mode) each payment is a row of the
// payments table and a state record, written in the request's
// transaction.
type api struct {
	store    idempotency.Store
	payments *paymentsTable // PostgreSQL and SQLite modes; nil otherwise
	states   *state.Store   // PostgreSQL and SQLite modes: the payments' state records
	logger   *slog.Logger
	// events, in PostgreSQL mode, makes each payment enqueue a
	// payment.created message in its transaction.
	events bool
	// captureAfter, in PostgreSQL and SQLite modes, makes each payment
	// authorized, its capture scheduled that long after it (see
	// captures.go); 0 captures it as it is made.
	captureAfter time.Duration

	mu       sync.Mutex
	inMemory map[string]payment // in memory
	executed atomic.Int64       // in memory: payments made
}

// newAPI returns the API over b's store and, in PostgreSQL and SQLite
// modes, its payments table and state records.
func newAPI(b *backend, logger *slog.Logger) *api {
	return &api{store: b.store, payments: b.payments, states: b.states, logger: logger, inMemory: map[string]payment{}}
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
		if a.payments != nil {
			// The payment's row, its state record and its scheduled
			// capture commit together with the key's record, in the
			// request's transaction.
			opts = append(opts, idempotency.WithTransaction(true))
			create = a.createPaymentTx
		}
		idem := idempotency.New(a.store, opts...)
		r.With(idem).Post("/payments", create)
		if a.payments != nil && a.captureAfter > 0 {
			// A capture's or a cancel's writes (the state record's
			// transition and its event, the payment's row, the capture
			// message's cancel) commit together, in its transaction.
			r.With(idem).Post("/payments/{id}/capture", a.settle(stateCaptured))
			r.With(idem).Post("/payments/{id}/cancel", a.settle(stateCanceled))
		}
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
	a.inMemory[p.ID] = p
	a.mu.Unlock()
	w.Header().Set("Location", "/payments/"+p.ID)
	writeJSON(w, http.StatusCreated, p)
}

// createPaymentTx makes a payment in PostgreSQL and SQLite modes: it
// inserts the row in the request's transaction, which the middleware
// commits together with the key's record once the handler has answered.
// The provider is called after the INSERT: when it fails, the 5xx rolls
// the transaction back, row included.
func (a *api) createPaymentTx(w http.ResponseWriter, r *http.Request) {
	p, ok := readPayment(w, r)
	if !ok {
		return
	}
	info, _ := idempotency.FromContext(r.Context())
	if !a.inTransaction(w, r) {
		return
	}
	// With scheduled captures the payment is authorized now and captured
	// later; without, it is captured now.
	p.Status = stateCaptured
	if a.captureAfter > 0 {
		at := time.Now().Add(a.captureAfter)
		p.Status, p.CaptureAt = stateAuthorized, &at
	}
	p, id, err := a.payments.insert(r.Context(), p, info.Key)
	if err != nil {
		a.serverError(w, r, http.StatusInternalServerError, "payment not recorded", fmt.Errorf("inserting a payment: %w", err))
		return
	}
	// The payment's state record, at its status (authorized, or captured
	// without scheduled captures), in the same transaction: a payment
	// whose provider fails leaves neither.
	rec, err := a.states.Create(r.Context(), paymentRef(p.User, p.ID), p.Status, recordData(p))
	if err != nil {
		a.serverError(w, r, http.StatusInternalServerError, "payment not recorded", fmt.Errorf("creating a payment's state record: %w", err))
		return
	}
	p.State, p.Version = rec.State, rec.Version
	if !a.charge(w, r) {
		return
	}
	if a.events {
		if err := enqueueCreated(r.Context(), p); err != nil {
			a.serverError(w, r, http.StatusInternalServerError, "payment not recorded", fmt.Errorf("enqueueing payment.created: %w", err))
			return
		}
	}
	if p.Status == stateAuthorized {
		if err := scheduleCapture(r.Context(), a.payments, id, *p.CaptureAt); err != nil {
			a.serverError(w, r, http.StatusInternalServerError, "payment not recorded", fmt.Errorf("scheduling the capture: %w", err))
			return
		}
	}
	w.Header().Set("Location", "/payments/"+p.ID)
	writeJSON(w, http.StatusCreated, p)
}

// inTransaction reports whether the request has its transaction, in
// which the payments table and the state records write, or else answers
// 500: the route has none without idempotency.WithTransaction(true) on a
// pgstore.Store or a sqlitestore.Store.
func (a *api) inTransaction(w http.ResponseWriter, r *http.Request) bool {
	if _, ok := a.payments.tx(r.Context()); ok {
		return true
	}
	a.serverError(w, r, http.StatusInternalServerError, "no transaction", errNoTransaction)
	return false
}

// utc returns t in UTC, nil for nil.
func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
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

// parsePaymentID returns the payments row id that the API's name id
// stands for, and false when it is not one.
func parsePaymentID(id string) (int64, bool) {
	digits, ok := strings.CutPrefix(id, "pay_")
	n, err := strconv.ParseInt(digits, 10, 64)
	return n, ok && err == nil
}

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
// and SQLite modes, from its row, with its state record's state and
// version.
func (a *api) lookup(ctx context.Context, id string) (payment, bool, error) {
	if a.payments == nil {
		a.mu.Lock()
		defer a.mu.Unlock()
		p, ok := a.inMemory[id]
		return p, ok, nil
	}
	n, ok := parsePaymentID(id)
	if !ok {
		return payment{}, false, nil
	}
	p, err := a.payments.read(ctx, n)
	if errors.Is(err, lifecycle.ErrNoRows) {
		return payment{}, false, nil
	}
	if err != nil {
		return payment{}, false, err
	}
	rec, err := a.states.Get(ctx, paymentRef(p.User, p.ID))
	switch {
	case errors.Is(err, state.ErrNotFound): // a payment made before its server kept records
	case err != nil:
		return payment{}, false, err
	default:
		p.State, p.Version = rec.State, rec.Version
	}
	return p, true, nil
}

// stats answers how many payments were made: in PostgreSQL and SQLite
// modes the rows of the payments table, which a transaction rolled back
// did not add.
func (a *api) stats(w http.ResponseWriter, r *http.Request) {
	n := a.executed.Load()
	var err error
	if a.payments != nil {
		n, err = a.payments.count(r.Context())
	}
	if err != nil {
		a.serverError(w, r, http.StatusInternalServerError, "payments not countable", fmt.Errorf("counting payments: %w", err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]int64{"payments_executed": n})
}
