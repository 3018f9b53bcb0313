package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency/internal/pgtest"
)

// The PostgreSQL mode's tests run against a real server, on a database of
// their own (internal/pgtest: IDEMPOTENCY_POSTGRES_URL, or the local
// server; skipped without one). They count the rows of the payments
// table, which has no unique constraint: a payment made twice would show.

// pgServer starts the API in PostgreSQL mode on the database at url, as
// main does with DATABASE_URL, and returns a client of it.
func pgServer(t *testing.T, url string) client {
	t.Helper()
	b, err := openBackend(context.Background(), "", url, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.close)
	return serve(t, b)
}

// serve serves the API over b until t ends, and returns a client of it.
// With events, payments enqueue payment.created (as with NATS_URL set).
func serve(t *testing.T, b *backend, events ...bool) client {
	t.Helper()
	if !strings.HasPrefix(b.name, "postgres ") || b.db == nil {
		t.Fatalf("store %q, database %v", b.name, b.db)
	}
	api := newAPI(b, slog.New(slog.DiscardHandler))
	api.events = len(events) > 0 && events[0]
	srv := httptest.NewServer(api.routes())
	t.Cleanup(srv.Close)
	return client{t, srv.URL}
}

// payments counts the rows of user's payments made with key.
func payments(t *testing.T, db *pgxpool.Pool, user, key string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(),
		`SELECT count(*) FROM payments WHERE user_name = $1 AND idempotency_key = $2`, user, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPostgresPayments runs two servers on one database, started together
// (both migrate at once): a first call inserts one row and answers with
// its id; the duplicate, sent to the other server, replays the response
// and inserts nothing.
func TestPostgresPayments(t *testing.T) {
	url := pgtest.Database(t)
	db := pgtest.PoolOn(t, url)
	var backends [2]*backend
	var errs [2]error
	var wg sync.WaitGroup
	for i := range backends {
		wg.Go(func() {
			backends[i], errs[i] = openBackend(context.Background(), "", url, slog.New(slog.DiscardHandler))
		})
	}
	wg.Wait()
	for _, b := range backends {
		if b != nil {
			t.Cleanup(b.close)
		}
	}
	var servers [2]client
	for i, b := range backends {
		if errs[i] != nil {
			t.Fatalf("server %d: %v", i, errs[i])
		}
		servers[i] = serve(t, b)
	}
	const body = `{"amount":1999,"currency":"EUR"}`

	first, firstBody := servers[0].post("/payments", aliceToken, "order-1", body)
	if first.StatusCode != http.StatusCreated || first.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first: %d %v %s", first.StatusCode, first.Header, firstBody)
	}
	var p payment
	if err := json.Unmarshal([]byte(firstBody), &p); err != nil {
		t.Fatal(err)
	}
	var id int64
	var user, key string
	var amount int64
	if err := db.QueryRow(context.Background(), `SELECT id, user_name, idempotency_key, amount FROM payments`).Scan(&id, &user, &key, &amount); err != nil {
		t.Fatalf("the payment's row: %v", err)
	}
	if p.ID != paymentID(id) || user != "alice" || key != "order-1" || amount != 1999 {
		t.Fatalf("answered %+v; row %d %s %s %d", p, id, user, key, amount)
	}

	again, againBody := servers[1].post("/payments", aliceToken, "order-1", body)
	if again.StatusCode != http.StatusCreated || againBody != firstBody || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("duplicate: %d %v %s", again.StatusCode, again.Header, againBody)
	}
	if n := payments(t, db, "alice", "order-1"); n != 1 {
		t.Fatalf("%d rows after a duplicate, want 1", n)
	}
	// Bob's order-1 is another payment: keys are scoped to the token's
	// user, and an X-User header naming alice changes nothing.
	req, _ := http.NewRequest(http.MethodPost, servers[1].url+"/payments", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+bobToken)
	req.Header.Set("X-User", "alice")
	req.Header.Set("Idempotency-Key", "order-1")
	if res, b := servers[1].do(req); res.StatusCode != http.StatusCreated || res.Header.Get("Idempotent-Replayed") != "" || b == firstBody {
		t.Fatalf("bob: %d %s", res.StatusCode, b)
	}
	if alice, bob := payments(t, db, "alice", "order-1"), payments(t, db, "bob", "order-1"); alice != 1 || bob != 1 {
		t.Fatalf("rows: alice %d, bob %d; want 1 and 1", alice, bob)
	}
	if n := servers[0].executed(); n != 2 {
		t.Fatalf("stats: %d payments, want 2", n)
	}

	// The payment is read back from its row, by its owner only.
	for _, tc := range []struct {
		token  string
		status int
	}{{aliceToken, http.StatusOK}, {bobToken, http.StatusNotFound}} {
		res, b := servers[1].get(first.Header.Get("Location"), tc.token)
		if res.StatusCode != tc.status || (tc.status == http.StatusOK && !strings.Contains(b, `"id":"`+p.ID+`"`)) {
			t.Fatalf("GET with %s: %d %s", tc.token, res.StatusCode, b)
		}
	}
}

// TestPostgresConcurrentDuplicates sends one payment 16 times at once,
// with a slow provider so that the duplicates find it in flight: one
// request runs it, the others get 409 or its replay, and the table holds
// one row.
func TestPostgresConcurrentDuplicates(t *testing.T) {
	url := pgtest.Database(t)
	c := pgServer(t, url)
	db := pgtest.PoolOn(t, url)
	const n, body = 16, `{"amount":500,"currency":"EUR"}`
	type answer struct {
		status   int
		replayed bool
		body     string
	}
	answers := make([]answer, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, c.url+"/payments?delay=300ms", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+aliceToken)
			req.Header.Set("Idempotency-Key", "order-9")
			<-start
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer res.Body.Close()
			b, _ := io.ReadAll(res.Body)
			answers[i] = answer{res.StatusCode, res.Header.Get("Idempotent-Replayed") == "true", string(b)}
		})
	}
	close(start)
	wg.Wait()
	var ran []string
	conflicts, replays := 0, 0
	for _, a := range answers {
		switch {
		case a.status == http.StatusCreated && !a.replayed:
			ran = append(ran, a.body)
		case a.status == http.StatusCreated:
			replays++
		case a.status == http.StatusConflict:
			conflicts++
		default:
			t.Errorf("answer %d %s", a.status, a.body)
		}
	}
	t.Logf("%d ran, %d conflicts, %d replays", len(ran), conflicts, replays)
	if len(ran) != 1 {
		t.Fatalf("%d requests ran the payment, want 1: %+v", len(ran), answers)
	}
	for _, a := range answers {
		if a.replayed && a.body != ran[0] {
			t.Errorf("replayed %s, the payment answered %s", a.body, ran[0])
		}
	}
	if rows := payments(t, db, "alice", "order-9"); rows != 1 {
		t.Fatalf("%d rows, want 1", rows)
	}
	res, b := c.post("/payments?delay=300ms", aliceToken, "order-9", body)
	if res.StatusCode != http.StatusCreated || b != ran[0] || res.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("a later duplicate: %d %v %s", res.StatusCode, res.Header, b)
	}
}

// TestPostgresProviderFailureRollsBack: when the provider fails after the
// payment's row was inserted, the 502 rolls the transaction back, row
// included, and releases the key: the retry makes the payment once.
func TestPostgresProviderFailureRollsBack(t *testing.T) {
	url := pgtest.Database(t)
	c := pgServer(t, url)
	db := pgtest.PoolOn(t, url)
	const body = `{"amount":700,"currency":"EUR"}`
	if res, b := c.post("/payments?provider=down", aliceToken, "order-5", body); res.StatusCode != http.StatusBadGateway {
		t.Fatalf("provider down: %d %s", res.StatusCode, b)
	}
	if n := payments(t, db, "alice", "order-5"); n != 0 {
		t.Fatalf("%d rows after a 502, want 0", n)
	}
	// The INSERT did run: it took an id from the sequence, which a
	// rollback does not give back.
	var taken bool
	if err := db.QueryRow(context.Background(), `SELECT is_called FROM payments_id_seq`).Scan(&taken); err != nil || !taken {
		t.Fatalf("the 502's INSERT did not run (is_called %v, %v)", taken, err)
	}
	res, b := c.post("/payments", aliceToken, "order-5", body)
	if res.StatusCode != http.StatusCreated || res.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry: %d %v %s", res.StatusCode, res.Header, b)
	}
	if n := payments(t, db, "alice", "order-5"); n != 1 {
		t.Fatalf("%d rows after the retry, want 1", n)
	}
	if n := c.executed(); n != 1 {
		t.Fatalf("stats: %d payments, want 1", n)
	}
}

// TestPostgresEvents: with events on, a payment enqueues one
// payment.created message carrying the payment, in its transaction: a
// duplicate adds none, and a payment whose provider failed leaves none.
func TestPostgresEvents(t *testing.T) {
	url := pgtest.Database(t)
	b, err := openBackend(context.Background(), "", url, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.close)
	c := serve(t, b, true)
	const body = `{"amount":1999,"currency":"EUR"}`
	for range 2 {
		if res, got := c.post("/payments", aliceToken, "order-1", body); res.StatusCode != http.StatusCreated {
			t.Fatalf("%d %s", res.StatusCode, got)
		}
	}
	if res, got := c.post("/payments?provider=down", aliceToken, "order-2", body); res.StatusCode != http.StatusBadGateway {
		t.Fatalf("provider down: %d %s", res.StatusCode, got)
	}
	rows, err := b.db.Query(context.Background(), `SELECT topic, payload, headers->>'Content-Type', seq FROM idempotency_outbox`)
	if err != nil {
		t.Fatal(err)
	}
	type message struct {
		topic, contentType string
		payload            []byte
		seq                int
	}
	var msgs []message
	for rows.Next() {
		var m message
		if err := rows.Scan(&m.topic, &m.payload, &m.contentType, &m.seq); err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 1 {
		t.Fatalf("%d messages in the outbox, want 1: %+v", len(msgs), msgs)
	}
	var p payment
	if err := json.Unmarshal(msgs[0].payload, &p); err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := b.db.QueryRow(context.Background(), `SELECT id FROM payments WHERE idempotency_key = 'order-1'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	m := msgs[0]
	if m.topic != topicPaymentCreated || m.contentType != "application/json" || m.seq != 1 || p.ID != paymentID(id) || p.User != "alice" || p.Amount != 1999 {
		t.Fatalf("message %s %s seq %d, payment %+v; want the row %d's", m.topic, m.contentType, m.seq, p, id)
	}
}
