package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/outboxtest"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/relay"
	"github.com/go-idempotency/idempotency/pgstore"
)

var ctx = context.Background()

// shop is a service behind the middleware on a transactional route: each
// request enqueues two messages (order, audit), then answers as its
// X-Outcome header says: "fail" 502 (released), "panic" panics, "refuse"
// writes a row whose deferred constraint fails the COMMIT; anything else
// 201.
type shop struct {
	db     *outboxtest.DB
	url    string
	client *http.Client

	mu       sync.Mutex
	attempts map[string][][]string // client key: the IDs each attempt's Enqueue returned
	hook     func(ctx context.Context, info idempotency.Info)
	// heartbeats, while false, makes every Extend fail, as in a process
	// whose heartbeats never land: its lease runs out while its handler
	// runs.
	heartbeats atomic.Bool
}

// paused is the store of a process whose heartbeats land only while
// *on is true.
type paused struct {
	*pgstore.Store
	on *atomic.Bool
}

func (p paused) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	if !p.on.Load() {
		return errors.New("extend: the process is paused")
	}
	return p.Store.Extend(ctx, key, token, lease)
}

func newShop(t *testing.T, opts ...idempotency.Option) *shop {
	t.Helper()
	s := &shop{db: outboxtest.NewDB(t), attempts: map[string][][]string{}}
	if _, err := s.db.Pool.Exec(ctx, refusingTables("public")); err != nil {
		t.Fatal(err)
	}
	mw := idempotency.New(paused{s.db.Store, &s.heartbeats}, append([]idempotency.Option{idempotency.WithTransaction(true)}, opts...)...)
	srv := httptest.NewServer(mw(http.HandlerFunc(s.order)))
	s.url = srv.URL
	s.client = &http.Client{Timeout: 30 * time.Second}
	t.Cleanup(func() {
		s.client.CloseIdleConnections()
		srv.Close()
	})
	return s
}

func (s *shop) order(w http.ResponseWriter, r *http.Request) {
	info, _ := idempotency.FromContext(r.Context())
	ids, err := outbox.Enqueue(r.Context(),
		outbox.Message{Topic: "orders", Payload: fmt.Appendf(nil, "%s at epoch %d", info.Key, info.Epoch)},
		outbox.Message{Topic: "audit", Headers: map[string]string{"epoch": fmt.Sprint(info.Epoch)}})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	s.mu.Lock()
	s.attempts[info.Key] = append(s.attempts[info.Key], ids)
	hook := s.hook
	s.mu.Unlock()
	if hook != nil {
		hook(r.Context(), info)
	}
	switch r.Header.Get("X-Outcome") {
	case "fail":
		w.WriteHeader(http.StatusBadGateway)
		return
	case "panic":
		panic(http.ErrAbortHandler)
	case "refuse":
		tx, _ := pgstore.TxFromContext(r.Context())
		if _, err := tx.Exec(r.Context(), `INSERT INTO refused VALUES (42)`); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	}
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "ordered at epoch %d", info.Epoch)
}

// lockWaits returns how many of the test database's sessions wait for a
// lock.
func (s *shop) lockWaits() int { return lockWaits(s.db.Pool, "") }

// post sends an order with key and returns the status and body (an
// error answer's problem code is in the body).
func (s *shop) post(t *testing.T, key, outcome string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.url, strings.NewReader("item=1"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(idempotency.HeaderKey, key)
	req.Header.Set("X-Outcome", outcome)
	res, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(body)
}

// table returns the IDs of every message in the outbox table.
func (s *shop) table(t *testing.T) []string {
	t.Helper()
	rows, err := s.db.Pool.Query(ctx, `SELECT storage_key || '/' || seq FROM idempotency_outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestCommittedOnly: the messages of requests whose transaction committed
// are all published; a 5xx, a panic and a COMMIT refused by a deferred
// constraint leave no row, and nothing of theirs is published.
func TestCommittedOnly(t *testing.T) {
	s := newShop(t)
	var committed, rolledBack []string
	for i := range 10 {
		key := fmt.Sprintf("ok-%d", i)
		if status, body := s.post(t, key, ""); status != http.StatusCreated {
			t.Fatalf("%s: %d %s", key, status, body)
		}
		committed = append(committed, s.attempts[key][0]...)
	}
	for _, c := range []struct {
		outcome string
		status  int
		code    string
	}{
		{"fail", http.StatusBadGateway, ""},
		{"panic", 0, ""},
		{"refuse", http.StatusServiceUnavailable, string(idempotency.CodeOutcomeUnknown)},
	} {
		for i := range 3 {
			key := fmt.Sprintf("%s-%d", c.outcome, i)
			if c.outcome == "panic" {
				s.postPanics(t, key)
			} else if status, body := s.post(t, key, c.outcome); status != c.status || !strings.Contains(body, c.code) {
				t.Fatalf("%s: %d %s, want %d %s", key, status, body, c.status, c.code)
			}
			rolledBack = append(rolledBack, s.attempts[key][0]...)
		}
	}
	if got := s.table(t); !slices.Equal(got, committed) {
		t.Fatalf("the outbox holds %d messages %v, want the %d committed ones", len(got), got, len(committed))
	}
	rec := outboxtest.NewRecorder()
	runRelay(t, s.db, rec)
	if err := rec.AwaitIDs(10*time.Second, committed...); err != nil {
		t.Fatal(err)
	}
	rec.ExpectOnceEach(t, committed)
	for _, id := range rolledBack {
		if rec.Count(id) != 0 {
			t.Errorf("%s of a rolled-back request published", id)
		}
	}
	reliability.Report(t, reliability.Result{Scenario: "outbox: only committed messages", Store: "postgres",
		Operations: 19, Faults: 9, Note: fmt.Sprintf("%d messages of 10 committed requests published once each; 0 rows and 0 publishes of 3 502s, 3 panics, 3 refused COMMITs (%d messages enqueued, rolled back)", len(committed), len(rolledBack))})
}

// postPanics sends an order whose handler panics: the connection is
// aborted.
func (s *shop) postPanics(t *testing.T, key string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.url, strings.NewReader("item=1"))
	req.Header.Set(idempotency.HeaderKey, key)
	req.Header.Set("X-Outcome", "panic")
	if res, err := s.client.Do(req); err == nil {
		res.Body.Close()
		t.Fatalf("%s: answered %d, want the connection aborted", key, res.StatusCode)
	}
}

// runRelay runs a relay on db's pool until t ends.
func runRelay(t *testing.T, db *outboxtest.DB, sink outbox.Sink, opts ...relay.Option) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		relay.New(db.Pool, sink, opts...).Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// TestLostLeaseStableIDs: the owner stalls after enqueueing, past its
// lease; a duplicate steals the record and enqueues its own messages,
// which get the same IDs; the owner's completion is refused and its
// messages rolled back. Only the thief's are published.
func TestLostLeaseStableIDs(t *testing.T) {
	s := newShop(t, idempotency.WithLease(400*time.Millisecond))
	stalled, ownerDone := make(chan struct{}), make(chan struct{})
	var waited atomic.Bool
	s.hook = func(ctx context.Context, info idempotency.Info) {
		if info.Epoch == 1 {
			close(stalled)
			<-ctx.Done()             // the lease ran out: cancelled before any steal
			s.heartbeats.Store(true) // the thief's land
			// The owner stalls on past its cancellation, its transaction
			// (and its uncommitted messages) still open, until the
			// thief's insert of the same message IDs waits on them.
			for deadline := time.Now().Add(10 * time.Second); s.lockWaits() == 0 && time.Now().Before(deadline); {
				time.Sleep(5 * time.Millisecond) // polling pg_stat_activity: no event to wait on
			}
			waited.Store(s.lockWaits() > 0)
		}
	}
	owner := make(chan string, 1)
	go func() {
		defer close(ownerDone)
		status, body := s.post(t, "k", "")
		owner <- fmt.Sprint(status, " ", body)
	}()
	<-stalled
	thief := make(chan string, 1)
	go func() {
		for {
			status, body := s.post(t, "k", "")
			if status != http.StatusConflict {
				thief <- fmt.Sprint(status, " ", body)
				return
			}
		}
	}()
	<-ownerDone
	if got := <-owner; !strings.HasPrefix(got, "503") || !strings.Contains(got, string(idempotency.CodeLeaseLost)) {
		t.Fatalf("owner got %s, want 503 lease_lost", got)
	}
	if got := <-thief; got != "201 ordered at epoch 2" {
		t.Fatalf("thief got %s", got)
	}
	if !waited.Load() {
		t.Fatal("the thief's insert never waited on the owner's uncommitted messages")
	}
	s.mu.Lock()
	a := s.attempts["k"]
	s.mu.Unlock()
	if len(a) != 2 || !slices.Equal(a[0], a[1]) || !strings.HasSuffix(a[0][0], "/1") || !strings.HasSuffix(a[0][1], "/2") {
		t.Fatalf("IDs of the two attempts: %v, want the same <key>/1, <key>/2", a)
	}
	rec := outboxtest.NewRecorder()
	runRelay(t, s.db, rec)
	if err := rec.AwaitIDs(10*time.Second, a[1]...); err != nil {
		t.Fatal(err)
	}
	rec.ExpectOnceEach(t, a[1])
	for _, d := range rec.Deliveries() {
		if d.Topic == "orders" && !strings.HasSuffix(string(d.Payload), "epoch 2") || d.Topic == "audit" && d.Headers["epoch"] != "2" {
			t.Errorf("published %s %q %v: not the thief's", d.Topic, d.Payload, d.Headers)
		}
	}
	if got := s.table(t); !slices.Equal(got, a[1]) {
		t.Errorf("outbox rows %v, want only the thief's %v", got, a[1])
	}
	reliability.Report(t, reliability.Result{Scenario: "outbox: owner stalled past its lease, stolen", Store: "postgres",
		Operations: 3, Faults: 1, Note: "both attempts numbered their 2 messages <key>/1, <key>/2; the owner's rolled back with its 503 lease_lost; the thief's 2 published once each"})
}

// TestOutboxTableOfTheStore: Enqueue writes to the outbox table of the
// Store that began the transaction, and a relay on that table publishes
// it.
func TestOutboxTableOfTheStore(t *testing.T) {
	db := outboxtest.NewDB(t)
	if _, err := db.Pool.Exec(ctx, `CREATE SCHEMA billing`); err != nil {
		t.Fatal(err)
	}
	opts := []pgstore.Option{pgstore.WithTable("billing.records"), pgstore.WithOutboxTable("billing.messages")}
	if err := pgstore.Migrate(ctx, db.Pool, opts...); err != nil {
		t.Fatal(err)
	}
	store := pgstore.New(db.Pool, opts...)
	defer store.Close()
	if store.OutboxTable() != "billing.messages" {
		t.Fatalf("OutboxTable() = %q", store.OutboxTable())
	}
	r := idempotency.NewRunner(store, idempotency.WithTransaction(true))
	res, err := idempotency.Do(ctx, r, idempotency.Call{Name: "n", Key: "k"}, func(ctx context.Context) ([]string, error) {
		return outbox.Enqueue(ctx, outbox.Message{Topic: "t"})
	})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM billing.messages`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("billing.messages holds %d rows, %v", n, err)
	}
	rec := outboxtest.NewRecorder()
	runRelay(t, db, rec, relay.WithTable("billing.messages"))
	if err := rec.AwaitIDs(10*time.Second, res.Value...); err != nil {
		t.Fatal(err)
	}
}

// TestID: IDs and their parts.
func TestID(t *testing.T) {
	if id := outbox.ID("abc", 7); id != "abc/7" {
		t.Errorf("ID = %q", id)
	}
	key, seq, err := outbox.ParseID("a/b/12")
	if err != nil || key != "a/b" || seq != 12 {
		t.Errorf("ParseID(a/b/12) = %q, %d, %v", key, seq, err)
	}
	for _, bad := range []string{"", "abc", "/1", "abc/0", "abc/01", "abc/-1", "abc/x", "abc/"} {
		if _, _, err := outbox.ParseID(bad); !errors.Is(err, outbox.ErrInvalidID) {
			t.Errorf("ParseID(%q): %v", bad, err)
		}
	}
}
