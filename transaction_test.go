package idempotency_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

// ledger is an in-process stand-in for the handler's database: rows are
// written in a transaction and become visible only when it commits, together
// with the key's record.
type ledger struct {
	idempotency.Store
	mu   sync.Mutex
	rows map[string]int // row -> times committed

	// commitFails makes Complete fail with an unknown outcome: "before"
	// commits nothing, "after" commits both and still reports an error.
	commitFails atomic.Value
	// commitHold, when set, holds Complete until it is closed.
	commitHold chan struct{}
}

func newLedger(t *testing.T) *ledger {
	return &ledger{Store: newMemStore(t), rows: map[string]int{}}
}

func (l *ledger) BeginTx(ctx context.Context, key, token string) (idempotency.Tx, error) {
	return &ledgerTx{l: l, key: key, token: token}, nil
}

func (l *ledger) count(row string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rows[row]
}

func (l *ledger) total() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.rows {
		n += c
	}
	return n
}

// ledgerTx is one transaction: staged rows, committed with the record.
type ledgerTx struct {
	l          *ledger
	key, token string
	mu         sync.Mutex
	staged     []string
	done       bool
}

// Insert stages a row.
func (tx *ledgerTx) Insert(row string) {
	tx.mu.Lock()
	tx.staged = append(tx.staged, row)
	tx.mu.Unlock()
}

func (tx *ledgerTx) Handle() any { return tx }

func (tx *ledgerTx) Complete(ctx context.Context, resp *idempotency.Response, ttl time.Duration) error {
	if tx.l.commitHold != nil {
		<-tx.l.commitHold
	}
	fails, _ := tx.l.commitFails.Load().(string)
	if fails == "before" {
		return errors.New("connection reset during COMMIT")
	}
	tx.l.mu.Lock()
	defer tx.l.mu.Unlock()
	// The record and the rows commit under one lock, fenced by the token.
	if err := tx.l.Store.Complete(ctx, tx.key, tx.token, resp, ttl); err != nil {
		return err
	}
	tx.mu.Lock()
	for _, r := range tx.staged {
		tx.l.rows[r]++
	}
	tx.done = true
	tx.mu.Unlock()
	if fails == "after" {
		return errors.New("connection reset after COMMIT was sent")
	}
	return nil
}

func (tx *ledgerTx) Rollback(ctx context.Context) error {
	tx.mu.Lock()
	if !tx.done {
		tx.staged = nil
	}
	tx.mu.Unlock()
	return nil
}

// payHandler inserts one row named after the key, through the request's
// transaction, and answers as status says (the query parameter).
func payHandler(t *testing.T) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, ok := idempotency.FromContext(r.Context())
		if !ok {
			t.Error("no Info in the handler's context")
			return
		}
		tx, ok := info.Tx.(*ledgerTx)
		if !ok {
			t.Errorf("Info.Tx = %T, want the store's transaction", info.Tx)
			return
		}
		tx.Insert("payment-" + info.Key)
		w.Header().Set("Location", "/payments/"+info.Key)
		switch r.URL.Query().Get("do") {
		case "fail":
			w.WriteHeader(http.StatusBadGateway)
		case "panic":
			panic("handler bug")
		case "bigheader":
			w.Header().Set("X-Big", strings.Repeat("h", 2<<10))
			w.WriteHeader(http.StatusCreated)
			if _, err := w.Write([]byte("{}")); err == nil {
				t.Error("a write after headers over the cap of a transactional route succeeded")
			}
		case "silent": // writes nothing: 200 with its headers
		case "big":
			w.WriteHeader(http.StatusCreated)
			_, err := w.Write([]byte(strings.Repeat("x", 2<<10)))
			if err == nil {
				t.Error("a write over the cap of a transactional route succeeded")
			}
		default:
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"key":%q,"epoch":%d}`, info.Key, info.Epoch)
		}
	})
}

func problemCode(t *testing.T, res *http.Response) idempotency.Code {
	t.Helper()
	var p idempotency.Problem
	body, _ := io.ReadAll(res.Body)
	if err := json.Unmarshal(body, &p); err != nil {
		return ""
	}
	return p.Code
}

// TestTransactionCommitsWithRecord: the handler's write and the record
// commit together; the client gets the response after the commit, and a
// duplicate replays it without a second write.
func TestTransactionCommitsWithRecord(t *testing.T) {
	l := newLedger(t)
	h := idempotency.New(l, idempotency.WithTransaction(true))(payHandler(t))
	res := do(h, http.MethodPost, "k1", "")
	if body := readAll(t, res); res.StatusCode != 201 || body != `{"key":"k1","epoch":1}` {
		t.Fatalf("first: %d %s", res.StatusCode, body)
	}
	if res.ContentLength != int64(len(`{"key":"k1","epoch":1}`)) && res.Header.Get("Content-Length") == "" {
		t.Fatalf("the held response has no Content-Length: %v", res.Header)
	}
	dup := do(h, http.MethodPost, "k1", "")
	if dup.Header.Get("Idempotent-Replayed") != "true" || l.count("payment-k1") != 1 {
		t.Fatalf("duplicate replayed=%q, rows %d", dup.Header.Get("Idempotent-Replayed"), l.count("payment-k1"))
	}
}

// TestTransactionRollsBack: a 5xx, a panic and a response over the cap roll
// the handler's write back and release the key, so a retry runs again and
// writes once.
func TestTransactionRollsBack(t *testing.T) {
	for _, tc := range []struct {
		do       string
		status   int
		problem  idempotency.Code
		panicked bool
	}{
		{"fail", http.StatusBadGateway, "", false},
		{"panic", 0, "", true},
		{"big", http.StatusInternalServerError, idempotency.CodeResponseTooLarge, false},
		{"bigheader", http.StatusInternalServerError, idempotency.CodeResponseTooLarge, false},
	} {
		t.Run(tc.do, func(t *testing.T) {
			l := newLedger(t)
			h := idempotency.New(l, idempotency.WithTransaction(true), idempotency.WithMaxResponseBody(1<<10), idempotency.WithMaxResponseHeader(1<<10))(payHandler(t))
			req := httptest.NewRequest(http.MethodPost, "/pay?do="+tc.do, nil)
			req.Header.Set("Idempotency-Key", "k")
			rec := httptest.NewRecorder()
			func() {
				defer func() {
					if v := recover(); (v != nil) != tc.panicked {
						t.Fatalf("panic %v, want panicked=%v", v, tc.panicked)
					}
				}()
				h.ServeHTTP(rec, req)
			}()
			if !tc.panicked {
				res := rec.Result()
				if res.StatusCode != tc.status {
					t.Fatalf("status %d, want %d", res.StatusCode, tc.status)
				}
				if tc.problem != "" {
					if res.Header.Get("Location") != "" {
						t.Fatalf("the problem carries the discarded response's headers: %v", res.Header)
					}
					if code := problemCode(t, res); code != tc.problem {
						t.Fatalf("problem %q, want %q", code, tc.problem)
					}
				}
			}
			if l.total() != 0 {
				t.Fatalf("%d rows committed by a rolled-back request", l.total())
			}
			if res := do(h, http.MethodPost, "k", ""); res.StatusCode != 201 || l.count("payment-k") != 1 {
				t.Fatalf("retry: %d, rows %d", res.StatusCode, l.count("payment-k"))
			}
		})
	}
}

// TestTransactionLeaseLost: a stale owner whose record was taken over
// commits nothing; its client gets 503 lease_lost; the thief's write is the
// only one.
func TestTransactionLeaseLost(t *testing.T) {
	const lease = 300 * time.Millisecond
	l := newLedger(t)
	fs := &failingStore{Store: l}
	unreachable := errors.New("extend: connection reset")
	fs.extendErr.Store(&unreachable)
	txs := &txFailing{failingStore: fs, ledger: l}
	entered, resume := make(chan struct{}), make(chan struct{})
	var runs atomic.Int64
	h := idempotency.New(txs, idempotency.WithTransaction(true), idempotency.WithLease(lease))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, _ := idempotency.FromContext(r.Context())
		info.Tx.(*ledgerTx).Insert(fmt.Sprint("row-epoch-", info.Epoch))
		if runs.Add(1) == 1 {
			close(entered)
			<-resume // a stale owner that does not look at its context
		}
		w.WriteHeader(http.StatusCreated)
	}))
	stale := make(chan *http.Response, 1)
	go func() { stale <- do(h, http.MethodPost, "k", "") }()
	<-entered
	var thief *http.Response
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		thief = do(h, http.MethodPost, "k", "")
		if thief.StatusCode != http.StatusConflict || time.Now().After(deadline) {
			break
		}
	}
	if thief.StatusCode != 201 {
		t.Fatalf("thief: %d", thief.StatusCode)
	}
	close(resume)
	res := <-stale
	if res.StatusCode != http.StatusServiceUnavailable || problemCode(t, res) != idempotency.CodeLeaseLost {
		t.Fatalf("stale owner's client: %d, want 503 lease_lost", res.StatusCode)
	}
	if l.count("row-epoch-1") != 0 || l.count("row-epoch-2") != 1 {
		t.Fatalf("rows %v: want only the thief's", l.rows)
	}
}

// txFailing is a failingStore that still begins transactions on the ledger.
type txFailing struct {
	*failingStore
	ledger *ledger
}

func (s *txFailing) BeginTx(ctx context.Context, key, token string) (idempotency.Tx, error) {
	return s.ledger.BeginTx(ctx, key, token)
}

// TestTransactionCommitUnknown: a COMMIT whose outcome is unknown answers
// 503 outcome_unknown either way; the retry then replays (it landed) or runs
// once more (it did not): one row in both cases.
func TestTransactionCommitUnknown(t *testing.T) {
	for _, when := range []string{"before", "after"} {
		t.Run(when, func(t *testing.T) {
			l := newLedger(t)
			h := idempotency.New(l, idempotency.WithTransaction(true))(payHandler(t))
			l.commitFails.Store(when)
			res := do(h, http.MethodPost, "k", "")
			if res.StatusCode != http.StatusServiceUnavailable || problemCode(t, res) != idempotency.CodeOutcomeUnknown {
				t.Fatalf("first: %d, want 503 outcome_unknown", res.StatusCode)
			}
			if res.Header.Get("Location") != "" {
				t.Fatal("the problem carries the handler's headers")
			}
			l.commitFails.Store("")
			retry := do(h, http.MethodPost, "k", "")
			replayed := retry.Header.Get("Idempotent-Replayed") == "true"
			if retry.StatusCode != 201 || replayed != (when == "after") || l.count("payment-k") != 1 {
				t.Fatalf("retry: %d replayed=%v rows %d", retry.StatusCode, replayed, l.count("payment-k"))
			}
		})
	}
}

// TestTransactionResponseAfterCommit: the client gets nothing, not even the
// status, before the commit, however the handler flushes.
func TestTransactionResponseAfterCommit(t *testing.T) {
	l := newLedger(t)
	l.commitHold = make(chan struct{})
	h := idempotency.New(l, idempotency.WithTransaction(true))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "part;")
		http.NewResponseController(w).Flush()
		io.WriteString(w, "rest")
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	got := make(chan string, 1)
	go func() { _, body := post(t, srv.Client(), srv.URL, "k", ""); got <- body }()
	select {
	case body := <-got:
		t.Fatalf("the client got %q before the commit", body)
	case <-time.After(200 * time.Millisecond): // nothing must arrive; only time can show it
	}
	close(l.commitHold)
	if body := <-got; body != "part;rest" {
		t.Fatalf("after the commit: %q", body)
	}
}

// TestFromContext: outside a transactional route the handler still learns
// its key, storage key and epoch; Tx is nil.
func TestFromContext(t *testing.T) {
	var got idempotency.Info
	var ok bool
	h := idempotency.New(newMemStore(t))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok = idempotency.FromContext(r.Context())
	}))
	do(h, http.MethodPost, `"abc"`, "")
	if !ok || got.Key != "abc" || got.StorageKey != idempotency.StorageKey("", "abc") || got.Epoch != 1 || got.Tx != nil {
		t.Fatalf("Info %+v, ok %v", got, ok)
	}
	if _, ok := idempotency.FromContext(context.Background()); ok {
		t.Fatal("Info outside a handler")
	}
}

func TestWithTransactionNeedsTxStore(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("WithTransaction on a store without transactions did not panic")
		}
	}()
	idempotency.New(newMemStore(t), idempotency.WithTransaction(true))
}

// TestTransactionSilentHandler: a handler that writes nothing answers 200
// with the headers it set, committed with its record like any response.
func TestTransactionSilentHandler(t *testing.T) {
	l := newLedger(t)
	h := idempotency.New(l, idempotency.WithTransaction(true))(payHandler(t))
	req := httptest.NewRequest(http.MethodPost, "/pay?do=silent", nil)
	req.Header.Set("Idempotency-Key", "k")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK || rec.Header().Get("Location") != "/payments/k" || l.count("payment-k") != 1 {
		t.Fatalf("silent handler: %d %v, rows %d", rec.Code, rec.Header(), l.count("payment-k"))
	}
	req = httptest.NewRequest(http.MethodPost, "/pay?do=silent", nil)
	req.Header.Set("Idempotency-Key", "k")
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK || rec.Header().Get(idempotency.HeaderReplayed) != "true" || l.count("payment-k") != 1 {
		t.Fatalf("duplicate of a silent handler: %d %v, rows %d", rec.Code, rec.Header(), l.count("payment-k"))
	}
}
