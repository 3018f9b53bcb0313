package sqlitestore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/fakeclock"
	"github.com/go-idempotency/idempotency/sqlitestore"
)

// The transactional proofs: a handler that writes a payment row in the
// request's transaction, behind the real middleware with WithTransaction.
// The payments table keys rows by the client's Idempotency-Key without a
// unique constraint, so a double would show.

const bankSchema = `CREATE TABLE payments (
	id       INTEGER PRIMARY KEY,
	idem_key TEXT    NOT NULL, -- not unique: a double execution would show
	epoch    INTEGER NOT NULL,
	amount   INTEGER NOT NULL
)`

// bank is a payments service behind the middleware on a transactional
// route, /pay.
type bank struct {
	t       *testing.T
	store   *sqlitestore.Store
	handler http.Handler

	mu   sync.Mutex
	hook func(r *http.Request, tx *sqlitestore.HandlerTx, info idempotency.Info) // runs after the payment's INSERT
}

func newBank(t *testing.T, store idempotency.TxStore, s *sqlitestore.Store, opts ...idempotency.Option) *bank {
	t.Helper()
	if _, err := s.DB().ExecContext(ctx, bankSchema); err != nil {
		t.Fatal(err)
	}
	b := &bank{t: t, store: s}
	b.handler = idempotency.New(store, append([]idempotency.Option{idempotency.WithTransaction(true)}, opts...)...)(http.HandlerFunc(b.pay))
	return b
}

func (b *bank) setHook(h func(r *http.Request, tx *sqlitestore.HandlerTx, info idempotency.Info)) {
	b.mu.Lock()
	b.hook = h
	b.mu.Unlock()
}

// pay writes the payment in the request's transaction and answers 201, or
// 502 (which releases the key) when the X-Outcome header says "fail".
func (b *bank) pay(w http.ResponseWriter, r *http.Request) {
	info, ok := idempotency.FromContext(r.Context())
	tx, txOK := sqlitestore.TxFromContext(r.Context())
	if !ok || !txOK {
		b.t.Error("no transaction in the handler's context")
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	body, _ := io.ReadAll(r.Body)
	if _, err := tx.ExecContext(r.Context(), `INSERT INTO payments (idem_key, epoch, amount) VALUES (?, ?, ?)`,
		info.Key, int64(info.Epoch), len(body)); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	b.mu.Lock()
	hook := b.hook
	b.mu.Unlock()
	if hook != nil {
		hook(r, tx, info)
	}
	if r.Header.Get("X-Outcome") == "fail" {
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "paid %s at epoch %d", info.Key, info.Epoch)
}

// answer is what a client got.
type answer struct {
	status   int
	body     string
	replayed bool
}

func (b *bank) post(key string, headers ...string) answer {
	req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader("amount=100"))
	req.Header.Set(idempotency.HeaderKey, key)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	b.handler.ServeHTTP(rec, req)
	return answer{status: rec.Code, body: rec.Body.String(), replayed: rec.Header().Get(idempotency.HeaderReplayed) == "true"}
}

// rows counts the payments of key.
func (b *bank) rows(key string) int {
	b.t.Helper()
	var n int
	if err := b.store.DB().QueryRowContext(ctx, `SELECT count(*) FROM payments WHERE idem_key = ?`, key).Scan(&n); err != nil {
		b.t.Fatal(err)
	}
	return n
}

// state returns the state of the record of the client's key, "" when
// there is no row.
func (b *bank) state(key string) string {
	b.t.Helper()
	var state string
	err := b.store.DB().QueryRowContext(ctx, `SELECT state FROM idempotency_records WHERE key = ?`,
		idempotency.StorageKey("", key)).Scan(&state)
	if err != nil && !strings.Contains(err.Error(), "no rows") {
		b.t.Fatal(err)
	}
	return state
}

func wantAnswer(t *testing.T, who string, a answer, status int, replayed bool) {
	t.Helper()
	if a.status != status || a.replayed != replayed {
		t.Fatalf("%s: %d %q (replayed %v); want %d (replayed %v)", who, a.status, a.body, a.replayed, status, replayed)
	}
}

// TestTxCommitsTogether: the payment and the record commit together; the
// duplicate replays, and there is one row.
func TestTxCommitsTogether(t *testing.T) {
	s := open(t, newPath(t))
	b := newBank(t, s, s)
	first := b.post("k-1")
	wantAnswer(t, "first", first, http.StatusCreated, false)
	dup := b.post("k-1")
	wantAnswer(t, "duplicate", dup, http.StatusCreated, true)
	if dup.body != first.body {
		t.Fatalf("replay %q, stored %q", dup.body, first.body)
	}
	if n, st := b.rows("k-1"), b.state("k-1"); n != 1 || st != "complete" {
		t.Fatalf("%d payment rows, record %q; want 1 and complete", n, st)
	}
	if n := s.OpenTxs(); n != 0 {
		t.Fatalf("%d transactions left open", n)
	}
}

// TestTxFailureRollsBack: a handler that answers 5xx rolls its payment
// back and releases the key; the retry pays once.
func TestTxFailureRollsBack(t *testing.T) {
	s := open(t, newPath(t))
	b := newBank(t, s, s)
	wantAnswer(t, "failing attempt", b.post("k-2", "X-Outcome", "fail"), http.StatusBadGateway, false)
	if n, st := b.rows("k-2"), b.state("k-2"); n != 0 || st != "" {
		t.Fatalf("after the 502: %d payment rows, record %q; want none", n, st)
	}
	wantAnswer(t, "retry", b.post("k-2"), http.StatusCreated, false)
	wantAnswer(t, "duplicate", b.post("k-2"), http.StatusCreated, true)
	if n := b.rows("k-2"); n != 1 {
		t.Fatalf("%d payment rows after the retry, want 1", n)
	}
}

// TestTxStolenLeaseLost: a record stolen from the token a transaction was
// begun for. Its Tx.Complete finds the record under another token: the
// fence updates nothing, the payment rolls back, and the record is the
// thief's, untouched. (Under SQLite no steal can happen while the
// transaction is open, since the steal is a write and the transaction
// holds the write lock; the steal here comes before the begin, as it does
// when the owner stalled between its acquire and its begin.)
func TestTxStolenLeaseLost(t *testing.T) {
	clock := fakeclock.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	s := open(t, newPath(t), sqlitestore.WithClock(clock.Now))
	if _, err := s.DB().ExecContext(ctx, bankSchema); err != nil {
		t.Fatal(err)
	}
	key := newKey()
	acquire(t, s, req(key, "owner", "fp", time.Second, time.Hour), idempotency.Acquired)
	clock.Advance(2 * time.Second) // the owner's lease ran out
	acquire(t, s, req(key, "thief", "fp", time.Minute, time.Hour), idempotency.Stolen)
	thief := rowOf(t, s, key)

	tx, err := s.BeginTx(ctx, key, "owner")
	if err != nil {
		t.Fatal(err)
	}
	h := tx.Handle().(*sqlitestore.HandlerTx)
	if _, err := h.ExecContext(ctx, `INSERT INTO payments (idem_key, epoch, amount) VALUES (?, 1, 100)`, key); err != nil {
		t.Fatal(err)
	}
	err = tx.Complete(ctx, &idempotency.Response{Status: http.StatusCreated}, time.Hour)
	if !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("Tx.Complete of the stolen record: %v, want ErrLeaseLost", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatalf("Rollback after Complete: %v", err)
	}
	var n int
	if err := s.DB().QueryRowContext(ctx, `SELECT count(*) FROM payments WHERE idem_key = ?`, key).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d payment rows (%v), want none", n, err)
	}
	if got := rowOf(t, s, key); got != thief {
		t.Fatalf("the thief's record changed:\n got %s\nwant %s", got, thief)
	}
	// The write lock was given back: the thief completes.
	if err := s.Complete(ctx, key, "thief", &idempotency.Response{Status: http.StatusOK}, time.Hour); err != nil {
		t.Fatal(err)
	}
}

// beginPayment acquires key for token on s, begins its transaction and
// writes its payment in it.
func beginPayment(t *testing.T, s *sqlitestore.Store, key, token string) idempotency.Tx {
	t.Helper()
	acquire(t, s, req(key, token, "fp", time.Minute, time.Hour), idempotency.Acquired)
	tx, err := s.BeginTx(ctx, key, token)
	if err != nil {
		t.Fatal(err)
	}
	h := tx.Handle().(*sqlitestore.HandlerTx)
	if _, err := h.ExecContext(ctx, `INSERT INTO payments (idem_key, epoch, amount) VALUES (?, 1, 100)`, key); err != nil {
		t.Fatal(err)
	}
	return tx
}

// TestTxTakesNoPoolConnection: a transaction runs on the connection of
// the Store's own writes, not on one of WithMaxConns's. With one
// connection in the pool, a replay and the application's own read go on
// while a transactional handler holds its transaction open (with the
// transaction on the pool's one connection, both waited for it).
func TestTxTakesNoPoolConnection(t *testing.T) {
	s := open(t, newPath(t), sqlitestore.WithMaxConns(1))
	if _, err := s.DB().ExecContext(ctx, bankSchema); err != nil {
		t.Fatal(err)
	}
	done := newKey()
	acquire(t, s, req(done, "a", "fp", time.Minute, time.Hour), idempotency.Acquired)
	if err := s.Complete(ctx, done, "a", &idempotency.Response{Status: http.StatusOK, Body: []byte("paid")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	key := newKey()
	tx := beginPayment(t, s, key, "b")
	defer tx.Rollback(ctx)

	bounded, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	a, err := s.Acquire(bounded, req(done, "c", "fp", time.Minute, time.Hour))
	if err != nil || a.Outcome != idempotency.Completed {
		t.Fatalf("a replay beside an open transaction: %+v, %v; want a replay", a, err)
	}
	var n int
	if err := s.DB().QueryRowContext(bounded, `SELECT count(*) FROM payments`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the application's read beside an open transaction: %d rows, %v; want 0 (uncommitted)", n, err)
	}
	if err := tx.Complete(ctx, &idempotency.Response{Status: http.StatusCreated}, time.Hour); err != nil {
		t.Fatal(err)
	}
}

// TestTxCompleteEndedContext: Tx.Complete with a context that ended
// rolls the transaction back, the payment with it, and leaves the record
// in progress; the write turn is given back.
func TestTxCompleteEndedContext(t *testing.T) {
	s := open(t, newPath(t))
	if _, err := s.DB().ExecContext(ctx, bankSchema); err != nil {
		t.Fatal(err)
	}
	key := newKey()
	tx := beginPayment(t, s, key, "owner")
	ended, cancel := context.WithCancel(ctx)
	cancel()
	err := tx.Complete(ended, &idempotency.Response{Status: http.StatusCreated}, time.Hour)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Tx.Complete with an ended context: %v, want context.Canceled", err)
	}
	var n int
	if err := s.DB().QueryRowContext(ctx, `SELECT count(*) FROM payments WHERE idem_key = ?`, key).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d payment rows (%v), want none", n, err)
	}
	acquire(t, s, req(key, "other", "fp", time.Minute, time.Hour), idempotency.InFlight)
	if err := s.Complete(ctx, key, "owner", &idempotency.Response{Status: http.StatusOK}, time.Hour); err != nil {
		t.Fatalf("Complete after the rolled-back transaction: %v", err)
	}
}

// TestTxOutlivesClose: a transaction begun before Close completes, or
// rolls back, after it, and Close does not wait for it. The file then
// holds the payment and the COMPLETE record together, or neither.
func TestTxOutlivesClose(t *testing.T) {
	for _, commit := range []bool{true, false} {
		t.Run(fmt.Sprintf("commit=%v", commit), func(t *testing.T) {
			path := newPath(t)
			s, err := sqlitestore.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.DB().ExecContext(ctx, bankSchema); err != nil {
				t.Fatal(err)
			}
			key := newKey()
			tx := beginPayment(t, s, key, "owner")
			closed := make(chan error, 1)
			go func() { closed <- s.Close() }()
			select {
			case err := <-closed:
				if err != nil {
					t.Fatalf("Close: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Close waits for the open transaction")
			}
			if commit {
				err = tx.Complete(ctx, &idempotency.Response{Status: http.StatusCreated, Body: []byte("paid")}, time.Hour)
			} else {
				err = tx.Rollback(ctx)
			}
			if err != nil {
				t.Fatalf("ending the transaction after Close: %v", err)
			}

			s = open(t, path)
			var payments int
			if err := s.DB().QueryRowContext(ctx, `SELECT count(*) FROM payments WHERE idem_key = ?`, key).Scan(&payments); err != nil {
				t.Fatal(err)
			}
			want, wantPayments := idempotency.InFlight, 0
			if commit {
				want, wantPayments = idempotency.Completed, 1
			}
			a, err := s.Acquire(ctx, req(key, "other", "fp", time.Minute, time.Hour))
			if err != nil || a.Outcome != want || payments != wantPayments {
				t.Fatalf("reopened: %v (%v), %d payment rows; want %v and %d", a.Outcome, err, payments, want, wantPayments)
			}
		})
	}
}

// extendCounter is the Store as the middleware sees it, counting the
// heartbeat's extends and their failures.
type extendCounter struct {
	*sqlitestore.Store
	extends, failed atomic.Int64
}

func (c *extendCounter) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	err := c.Store.Extend(ctx, key, token, lease)
	c.extends.Add(1)
	if err != nil {
		c.failed.Add(1)
	}
	return err
}

// TestTxLongHandlerHeartbeat: a transactional handler runs three times as
// long as its lease. It holds the file's write lock, so an extend in a
// transaction of its own would wait for the handler and fail, and the
// middleware would cancel a healthy handler; the Store runs the
// heartbeat's extends inside the request's transaction instead. The
// handler is never cancelled, and the payment commits once.
func TestTxLongHandlerHeartbeat(t *testing.T) {
	const lease, runs = 300 * time.Millisecond, time.Second
	s := open(t, newPath(t))
	counter := &extendCounter{Store: s}
	b := newBank(t, counter, s, idempotency.WithLease(lease))
	var cancelled atomic.Value
	b.setHook(func(r *http.Request, tx *sqlitestore.HandlerTx, info idempotency.Info) {
		select {
		case <-r.Context().Done():
			cancelled.Store(context.Cause(r.Context()).Error())
		case <-time.After(runs):
		}
	})
	first := b.post("k-long")
	if c := cancelled.Load(); c != nil {
		t.Fatalf("the handler was cancelled: %v", c)
	}
	wantAnswer(t, "long handler", first, http.StatusCreated, false)
	if e, f := counter.extends.Load(), counter.failed.Load(); e < 2 || f != 0 {
		t.Fatalf("%d extends, %d failed; want at least 2, none failed", e, f)
	}
	b.setHook(nil)
	wantAnswer(t, "duplicate", b.post("k-long"), http.StatusCreated, true)
	if n, st := b.rows("k-long"), b.state("k-long"); n != 1 || st != "complete" {
		t.Fatalf("%d payment rows, record %q; want 1 and complete", n, st)
	}
}

// TestHandlerCannotCommit: the handler's transaction has no Commit or
// Rollback, and TxFromContext finds no transaction outside a
// transactional route.
func TestHandlerCannotCommit(t *testing.T) {
	ht := reflect.TypeFor[*sqlitestore.HandlerTx]()
	for _, m := range []string{"Commit", "Rollback"} {
		if _, ok := ht.MethodByName(m); ok {
			t.Errorf("HandlerTx has a method %s", m)
		}
	}
	var handle any = &sqlitestore.HandlerTx{}
	if _, ok := handle.(interface{ Commit() error }); ok {
		t.Error("a HandlerTx can commit")
	}
	if _, ok := sqlitestore.TxFromContext(context.Background()); ok {
		t.Fatal("a transaction outside a handler")
	}
	s := open(t, newPath(t))
	var inPlain, inTx bool
	plain := idempotency.New(s)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, inPlain = sqlitestore.TxFromContext(r.Context())
	}))
	transactional := idempotency.New(s, idempotency.WithTransaction(true))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, inTx = sqlitestore.TxFromContext(r.Context())
	}))
	for _, h := range []http.Handler{plain, transactional} {
		req := httptest.NewRequest(http.MethodPost, "/", nil)
		req.Header.Set(idempotency.HeaderKey, "k-"+newKey()[:8])
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	if inPlain || !inTx {
		t.Fatalf("TxFromContext: %v on a plain route, %v on a transactional one; want false, true", inPlain, inTx)
	}
}
