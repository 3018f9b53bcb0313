package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/state"
)

// State records, in PostgreSQL and SQLite modes: each payment is also a record of
// package state (machine payments.payment, scope its user, id its API
// id), created authorized at version 1 in the payment's transaction. Its
// capture (POST /payments/{id}/capture, or the scheduled one of
// captures.go) and its cancel (POST /payments/{id}/cancel) are
// transitions from authorized: compare-and-swaps on the record's state
// and version, each writing its event into the outbox in the transaction
// that commits it. An idempotency key makes each request happen once;
// the record is what lets only one of a capture and a cancel sent with
// two keys happen at all. The loser is answered 409 state_conflict with
// the record as the winner left it, and its duplicates replay that.
//
// The payments row keeps the status for the payment's own queries; it is
// written after the record's transition, in its transaction, so the two
// never disagree.

// machinePayment is the machine of the payments' state records.
const machinePayment = "payments.payment"

// The states of a payment's record (and the status of its row).
const (
	stateAuthorized = "authorized"
	stateCaptured   = "captured"
	stateCanceled   = "canceled"
)

// paymentRef names the state record of the payment id of user: the user
// is its scope, so that a user never reaches another's payment, as the
// idempotency keys are scoped too.
func paymentRef(user, id string) state.Ref {
	return state.Ref{Scope: user, Machine: machinePayment, ID: id}
}

// recordData is the data a payment's record is created with, which
// idemctl state shows with it.
func recordData(p payment) json.RawMessage {
	b, _ := json.Marshal(map[string]any{"amount": p.Amount, "currency": p.Currency}) // cannot fail: a number and a string
	return b
}

// settle returns the handler of a route that moves the payment from
// authorized to to (captured or canceled) now, in the request's
// transaction: the record's transition and its event, the payments row,
// and the cancel of the scheduled capture, which is no longer to run,
// commit together with the key's record, or not at all. The answer is the
// payment with its record's state and version; a payment no longer
// authorized, or not at the version the client sent, is 409
// state_conflict with the record as it is.
//
// The record is locked by the transition before the row is written, and
// the scheduled capture takes them in the same order, so that the two
// never wait for each other in a circle (in PostgreSQL mode: SQLite runs
// one writing transaction at a time).
func (a *api) settle(to string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !a.inTransaction(w, r) {
			return
		}
		ctx := r.Context()
		ref := paymentRef(user(r), chi.URLParam(r, "id"))
		id, ok := parsePaymentID(ref.ID)
		if !ok {
			state.WriteError(w, r, &state.NotFoundError{Ref: ref})
			return
		}
		version, err := a.expectedVersion(ctx, r, ref)
		if err != nil {
			a.stateError(w, r, err)
			return
		}
		rec, err := a.states.Transition(ctx, ref, state.Change{From: stateAuthorized, To: to, ExpectedVersion: version})
		if err != nil {
			a.stateError(w, r, err)
			return
		}
		p, captureID, err := a.payments.settle(ctx, id, to)
		if err != nil {
			a.serverError(w, r, http.StatusInternalServerError, "payment not "+to, fmt.Errorf("updating a payment: %w", err))
			return
		}
		// The capture message may have finished already (dead, its
		// attempts spent): nothing is left to cancel then.
		if captureID != "" {
			if _, err := outbox.Cancel(ctx, captureID); err != nil {
				a.serverError(w, r, http.StatusInternalServerError, "payment not "+to, fmt.Errorf("canceling the capture %s: %w", captureID, err))
				return
			}
		}
		p.State, p.Version = rec.State, rec.Version
		writeJSON(w, http.StatusOK, p)
	}
}

// expectedVersion returns the version the request expects the payment's
// record at. A client that sends If-Match (the version it read, bare or
// as an entity tag: 1 or "1") gets its change refused when the payment
// moved since it read it: it decided on what it saw. Without If-Match, the
// version is the record's as this request's transaction reads it now
// (Get): the request then asks only that the payment be authorized, and
// of two racing ones the second still finds the first's version, or its
// state, and is refused.
func (a *api) expectedVersion(ctx context.Context, r *http.Request, ref state.Ref) (int64, error) {
	if v := r.Header.Get("If-Match"); v != "" {
		n, err := strconv.ParseInt(strings.Trim(v, `"`), 10, 64)
		if err != nil {
			return 0, &state.InvalidArgumentError{Field: "expected_version", Reason: "If-Match " + strconv.Quote(v) + " is not a version"}
		}
		return n, nil // Transition refuses one out of range
	}
	rec, err := a.states.Get(ctx, ref)
	if err != nil {
		return 0, err
	}
	return rec.Version, nil
}

// stateError answers err, a state.Store's, with its problem
// (state.WriteError): 409 state_conflict with the record's state and
// version, 404, 422; or 503 for a failed statement (500 for any other
// error), which rolls the request's transaction back and releases its
// key, and is logged here, since its problem does not say why.
func (a *api) stateError(w http.ResponseWriter, r *http.Request, err error) {
	if p := state.ProblemFor(err); p == nil || p.Status >= http.StatusInternalServerError {
		a.logger.ErrorContext(r.Context(), "state record", "method", r.Method, "path", r.URL.Path, "user", user(r), "error", err)
	}
	state.WriteError(w, r, err)
}
