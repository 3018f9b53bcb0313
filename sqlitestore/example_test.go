package sqlitestore_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/sqlitestore"
)

// A store in a file, a route run twice (the second request replays the
// first's response), and a transactional route whose payment row and
// record commit together.
func Example() {
	dir, err := os.MkdirTemp("", "sqlitestore-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	store, err := sqlitestore.Open(filepath.Join(dir, "app.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	// The application's own table, in the same file.
	if _, err := store.DB().Exec(`CREATE TABLE payments (idempotency_key TEXT NOT NULL, amount INTEGER NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	mux := http.NewServeMux()
	mux.Handle("POST /orders", idempotency.New(store)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "order 1")
	})))
	mux.Handle("POST /payments", idempotency.New(store, idempotency.WithTransaction(true))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, _ := idempotency.FromContext(r.Context())
		tx, _ := sqlitestore.TxFromContext(r.Context())
		res, err := tx.ExecContext(r.Context(), `INSERT INTO payments (idempotency_key, amount) VALUES (?, ?)`, info.Key, 100)
		if err != nil {
			// A 5xx rolls the transaction back and releases the key.
			http.Error(w, "payment failed", http.StatusInternalServerError)
			return
		}
		id, _ := res.LastInsertId()
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "payment %d", id)
	})))

	send := func(path, key string) {
		req := httptest.NewRequest(http.MethodPost, path, nil)
		req.Header.Set(idempotency.HeaderKey, key)
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		fmt.Printf("%s: %d %q replayed=%v\n", path, rec.Code, rec.Body.String(), rec.Header().Get(idempotency.HeaderReplayed) == "true")
	}
	send("/orders", "order-7")
	send("/orders", "order-7")
	send("/payments", "payment-7")
	send("/payments", "payment-7")

	var payments int
	if err := store.DB().QueryRow(`SELECT count(*) FROM payments`).Scan(&payments); err != nil {
		log.Fatal(err)
	}
	fmt.Println("payment rows:", payments)
	// Output:
	// /orders: 201 "order 1" replayed=false
	// /orders: 201 "order 1" replayed=true
	// /payments: 201 "payment 1" replayed=false
	// /payments: 201 "payment 1" replayed=true
	// payment rows: 1
}
