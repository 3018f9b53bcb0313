package pgstore_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/pgstore"
)

// Set-up: a pool, the table, a store, the middleware.
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := pgstore.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	store := pgstore.New(pool, pgstore.WithPurgeInterval(time.Minute))
	defer store.Close()

	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})
	log.Fatal(http.ListenAndServe(":8080", idempotency.New(store)(mux)))
}

// Transactional completion: the payment and the key's record commit
// together, so a payment is made once whatever crashes, stalls or steals
// happen.
func ExampleTxFromContext() {
	var store *pgstore.Store // from pgstore.New
	pay := func(w http.ResponseWriter, r *http.Request) {
		info, _ := idempotency.FromContext(r.Context())
		tx, _ := pgstore.TxFromContext(r.Context())
		var id int64
		err := tx.QueryRow(r.Context(),
			`INSERT INTO payments (idempotency_key, amount) VALUES ($1, $2) RETURNING id`,
			info.Key, 100).Scan(&id)
		if err != nil {
			// A 5xx rolls the transaction back and releases the key.
			http.Error(w, "payment failed", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"payment":%d}`, id)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", idempotency.New(store, idempotency.WithTransaction(true))(http.HandlerFunc(pay)))
}

// Purge from a job of your own, in batches, until the backlog is gone.
func ExampleStore_Purge() {
	var store *pgstore.Store // from pgstore.New
	ctx := context.Background()
	for {
		n, err := store.Purge(ctx, 1000)
		if err != nil {
			log.Print(err)
			return
		}
		if n < 1000 {
			return
		}
	}
}

// The SQL for teams that run their own migrations: the table's name is
// put in, quoted, and the acquire function is named after it.
func ExampleSchema() {
	for _, line := range strings.Split(pgstore.Schema("billing.idempotency_records"), "\n") {
		if strings.HasPrefix(line, "CREATE") {
			fmt.Println(line)
		}
	}
	// Output:
	// CREATE TABLE IF NOT EXISTS "billing"."idempotency_records" (
	// CREATE INDEX IF NOT EXISTS "idempotency_records_expires_at_idx"
	// CREATE OR REPLACE FUNCTION "billing"."idempotency_records_acquire"(
	// CREATE TABLE IF NOT EXISTS "billing"."idempotency_outbox" (
	// CREATE INDEX IF NOT EXISTS "idempotency_outbox_due_idx"
	// CREATE INDEX IF NOT EXISTS "idempotency_outbox_order_idx"
	// CREATE INDEX IF NOT EXISTS "idempotency_outbox_claim_idx"
	// CREATE INDEX IF NOT EXISTS "idempotency_outbox_finished_idx"
	// CREATE TABLE IF NOT EXISTS "billing"."idempotency_state" (
	// CREATE TABLE IF NOT EXISTS "billing"."idempotency_state_history" (
}

// Transactional completion for any function: a message consumer applies a
// payment once per business key, its row and the key's record committed
// together.
func ExampleTxFromContext_function() {
	var store *pgstore.Store // from pgstore.New
	apply := idempotency.NewRunner(store, idempotency.WithTransaction(true))

	handle := func(ctx context.Context, paymentID string, body []byte) error {
		c := idempotency.Call{Name: "payment.apply", Key: paymentID, Payload: body}
		_, err := idempotency.Do(ctx, apply, c, func(ctx context.Context) (int64, error) {
			tx, _ := pgstore.TxFromContext(ctx)
			var id int64
			err := tx.QueryRow(ctx, `INSERT INTO ledger (payment_id) VALUES ($1) RETURNING id`, paymentID).Scan(&id)
			return id, err // an error rolls back and releases the key
		})
		return err // nil: applied now, or before (a replay)
	}
	_ = handle
}
