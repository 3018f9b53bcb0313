package state_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/pgstore"
	"github.com/go-idempotency/idempotency/state"
)

// A capture route: transactional (the middleware on pgstore with
// WithTransaction(true)), its transition made in the route's transaction,
// committed with the idempotency record. A cancel racing on the same
// payment with another key is refused with 409 state_conflict and the
// payment as the capture left it; a duplicate of either is its answer
// replayed.
func Example() {
	var pool *pgxpool.Pool // pgstore.Migrate(ctx, pool) created the tables
	store := pgstore.New(pool)
	payments := state.New(pool)
	mw := idempotency.New(store, idempotency.WithTransaction(true))

	mux := http.NewServeMux()
	mux.Handle("POST /payments/{id}/capture", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The client sends the version it read, as an If-Match.
		version, _ := strconv.ParseInt(r.Header.Get("If-Match"), 10, 64)
		ref := state.Ref{Scope: "acme", Machine: "payments.payment", ID: r.PathValue("id")}
		rec, err := payments.Transition(r.Context(), ref, state.Change{From: "authorized", To: "captured", ExpectedVersion: version})
		if err != nil {
			state.WriteError(w, r, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(rec)
	})))
	_ = http.ListenAndServe("127.0.0.1:8080", mux)
}

// A consumer applying a message with idempotency.Do: a conflict is a
// refusal for good (idempotency.OutcomeRefused), so the message is
// terminated, not retried.
func ExampleStore_Transition_consumer() {
	var runner *idempotency.Runner // transactional, on pgstore
	var payments *state.Store
	settle := func(ctx context.Context, paymentID string, body []byte) error {
		ref := state.Ref{Scope: "acme", Machine: "payments.payment", ID: paymentID}
		res, err := idempotency.Do(ctx, runner, idempotency.Call{Name: "payment.settle", Key: paymentID, Payload: body},
			func(ctx context.Context) (state.Record, error) {
				return payments.Transition(ctx, ref, state.Change{From: "captured", To: "settled", ExpectedVersion: 2})
			})
		var conflict *state.ConflictError
		if errors.As(err, &conflict) {
			fmt.Printf("%s is %s at version %d: %v\n", paymentID, conflict.Current.State, conflict.Current.Version, res.Outcome)
		}
		return err
	}
	_ = settle
}
