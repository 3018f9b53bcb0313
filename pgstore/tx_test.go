package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/faultproxy"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/pgstore"
)

// The transactional proofs: a handler that writes a payment row in the
// request's transaction, behind the real middleware with WithTransaction,
// while the owner's connection is killed, the owner stalls past its lease
// and is stolen from, or the COMMIT fails. The payments table keys rows by
// the client's Idempotency-Key without a unique constraint, so a double
// would show. Afterwards every key has exactly one row if its record is
// COMPLETE and none otherwise, and every client got the stored response
// or a 503 problem that says what happened.

const bankSchema = `
CREATE TABLE accounts (id int PRIMARY KEY);
INSERT INTO accounts VALUES (1);
CREATE TABLE payments (
	id       bigserial PRIMARY KEY,
	idem_key text   NOT NULL, -- not unique: a double execution would show
	epoch    bigint NOT NULL,
	account  int    NOT NULL REFERENCES accounts DEFERRABLE INITIALLY DEFERRED,
	amount   int    NOT NULL
);`

// bank is a payments service behind the middleware on transactional
// routes: /pay, and /wait with wait mode.
type bank struct {
	t      *testing.T
	admin  *pgxpool.Pool // a pool of its own, for checks and faults
	store  *pgstore.Store
	url    string
	client *http.Client

	mu   sync.Mutex
	hook func(r *http.Request, tx pgx.Tx, info idempotency.Info) // runs after the payment's INSERT
}

type bankConfig struct {
	lease     time.Duration
	storeOpts []pgstore.Option
	wrap      func(*pgstore.Store) idempotency.TxStore // the store the middleware uses
	pool      func(t *testing.T, url string) *pgxpool.Pool
}

func newBank(t *testing.T, cfg bankConfig) *bank {
	t.Helper()
	url := pgtest.Database(t)
	admin := pgtest.PoolOn(t, url)
	if err := pgstore.Migrate(ctx, admin); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, bankSchema); err != nil {
		t.Fatal(err)
	}
	pool := admin
	if cfg.pool != nil {
		pool = cfg.pool(t, url)
	} else {
		pool = pgtest.PoolOn(t, url, func(c *pgxpool.Config) { c.MaxConns = 16 })
	}
	b := &bank{t: t, admin: admin, store: newStore(t, pool, cfg.storeOpts...)}
	var store idempotency.TxStore = b.store
	if cfg.wrap != nil {
		store = cfg.wrap(b.store)
	}
	opts := []idempotency.Option{idempotency.WithTransaction(true)}
	if cfg.lease > 0 {
		opts = append(opts, idempotency.WithLease(cfg.lease))
	}
	mux := http.NewServeMux()
	mux.Handle("POST /pay", idempotency.New(store, opts...)(http.HandlerFunc(b.pay)))
	mux.Handle("POST /wait", idempotency.New(store, append(opts, idempotency.WithWait(5*time.Second))...)(http.HandlerFunc(b.pay)))
	srv := httptest.NewServer(mux)
	b.url = srv.URL
	b.client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	t.Cleanup(func() {
		b.client.CloseIdleConnections()
		srv.Close()
	})
	return b
}

func (b *bank) setHook(h func(r *http.Request, tx pgx.Tx, info idempotency.Info)) {
	b.mu.Lock()
	b.hook = h
	b.mu.Unlock()
}

// pay writes the payment in the request's transaction and answers 201,
// or as the X-Outcome header says: "fail" answers 502 (released), "panic"
// panics.
func (b *bank) pay(w http.ResponseWriter, r *http.Request) {
	info, ok := idempotency.FromContext(r.Context())
	tx, txOK := pgstore.TxFromContext(r.Context())
	if !ok || !txOK {
		b.t.Error("no transaction in the handler's context")
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	account := r.Header.Get("X-Account")
	if account == "" {
		account = "1"
	}
	body, _ := io.ReadAll(r.Body)
	amount := len(body)
	if _, err := tx.Exec(r.Context(), `INSERT INTO payments (idem_key, epoch, account, amount) VALUES ($1, $2, $3, $4)`,
		info.Key, int64(info.Epoch), account, amount); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	b.mu.Lock()
	hook := b.hook
	b.mu.Unlock()
	if hook != nil {
		hook(r, tx, info)
	}
	switch r.Header.Get("X-Outcome") {
	case "fail":
		w.WriteHeader(http.StatusBadGateway)
		return
	case "panic":
		panic(http.ErrAbortHandler)
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
	code     string
	err      error
}

func (a answer) String() string {
	switch {
	case a.err != nil:
		return "error: " + a.err.Error()
	case a.code != "":
		return fmt.Sprintf("%d %s", a.status, a.code)
	case a.replayed:
		return fmt.Sprintf("%d replay %q", a.status, a.body)
	}
	return fmt.Sprintf("%d %q", a.status, a.body)
}

// post sends a payment with key to the route without wait mode, with extra
// headers as name, value pairs.
func (b *bank) post(key string, headers ...string) answer { return b.postTo("/pay", key, headers...) }

// postTo sends a payment to path: /pay, or /wait (wait mode).
func (b *bank) postTo(path, key string, headers ...string) answer {
	req, err := http.NewRequest(http.MethodPost, b.url+path, strings.NewReader("amount=100"))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set(idempotency.HeaderKey, key)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := b.client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	a := answer{status: res.StatusCode, body: string(body), replayed: res.Header.Get(idempotency.HeaderReplayed) == "true", err: err}
	if strings.HasPrefix(res.Header.Get("Content-Type"), "application/problem+json") {
		if i := strings.Index(a.body, `"code":"`); i >= 0 {
			rest := a.body[i+len(`"code":"`):]
			a.code = rest[:strings.IndexByte(rest, '"')]
		}
	}
	return a
}

// postPast409 posts until the answer is not 409, for at most 10 seconds.
func (b *bank) postPast409(key string, headers ...string) answer {
	deadline := time.Now().Add(10 * time.Second)
	for {
		a := b.post(key, headers...)
		if a.status != http.StatusConflict || time.Now().After(deadline) {
			return a
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ledger is what the database holds per client key: payment rows and
// whether the key's record is COMPLETE.
type ledger struct {
	rows     map[string]int
	complete map[string]bool
}

func (b *bank) ledger() ledger {
	b.t.Helper()
	l := ledger{rows: map[string]int{}, complete: map[string]bool{}}
	rows, err := b.admin.Query(ctx, `SELECT idem_key, count(*) FROM payments GROUP BY idem_key`)
	if err != nil {
		b.t.Fatal(err)
	}
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			b.t.Fatal(err)
		}
		l.rows[k] = n
	}
	if rows.Err() != nil {
		b.t.Fatal(rows.Err())
	}
	rows, err = b.admin.Query(ctx, `SELECT key FROM idempotency_records WHERE state = 'complete'`)
	if err != nil {
		b.t.Fatal(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		b.t.Fatal(err)
	}
	for _, k := range keys {
		l.complete[k] = true
	}
	return l
}

// check returns the violations of the exactly-once invariant over keys: a
// key with more than one payment, or whose payments disagree with its
// record (a row without a COMPLETE record, or the other way round).
func (l ledger) check(keys ...string) []string {
	var v []string
	for _, k := range keys {
		n, done := l.rows[k], l.complete[idempotency.StorageKey("", k)]
		if n > 1 || (n == 1) != done {
			v = append(v, fmt.Sprintf("key %s: %d payment rows, record complete: %v", k, n, done))
		}
	}
	return v
}

// report checks the ledger for keys, fails t on a violation, and reports
// the scenario.
func (b *bank) report(scenario string, ops int64, keys []string, note string) {
	b.t.Helper()
	v := b.ledger().check(keys...)
	for _, s := range v {
		b.t.Error(s)
	}
	reliability.Report(b.t, reliability.Result{Scenario: scenario, Store: "postgres",
		Operations: ops, Faults: 1, Violations: int64(len(v)), Note: note})
}

func wantAnswer(t *testing.T, who string, a answer, status int, code string, replayed bool) {
	t.Helper()
	if a.err != nil || a.status != status || a.code != code || a.replayed != replayed {
		t.Fatalf("%s: %v; want %d %s (replayed %v)", who, a, status, code, replayed)
	}
}

// TestTxOwnerConnectionKilled (a): the owner's connection is terminated
// after its payment's INSERT and before the commit. Nothing committed: the
// client gets 503 outcome_unknown, the key is released, and its retry runs
// once more and pays once.
func TestTxOwnerConnectionKilled(t *testing.T) {
	b := newBank(t, bankConfig{})
	var once sync.Once
	b.setHook(func(r *http.Request, tx pgx.Tx, info idempotency.Info) {
		once.Do(func() { pgtest.Terminate(t, b.admin, tx.Conn().PgConn().PID()) })
	})
	first := b.post("k-a")
	wantAnswer(t, "owner whose connection died", first, http.StatusServiceUnavailable, string(idempotency.CodeOutcomeUnknown), false)
	if l := b.ledger(); l.rows["k-a"] != 0 {
		t.Fatalf("%d rows after the killed attempt", l.rows["k-a"])
	}
	retry := b.post("k-a")
	wantAnswer(t, "retry", retry, http.StatusCreated, "", false)
	dup := b.post("k-a")
	wantAnswer(t, "duplicate", dup, http.StatusCreated, "", true)
	if dup.body != retry.body {
		t.Fatalf("replay %q, stored %q", dup.body, retry.body)
	}
	b.report("transaction: owner's connection killed before the commit", 3, []string{"k-a"},
		"1 row; answers: 503 outcome_unknown, 201, replay")
}

// paused is the store as a process that has stopped (a long GC pause, a
// stop signal, a partition from the database) sees it: its heartbeats
// never land, so its lease runs out while its handler still runs.
type paused struct{ *pgstore.Store }

func (paused) Extend(context.Context, string, string, time.Duration) error {
	return errors.New("extend: the process is paused")
}

// TestTxStolenFromStalledOwner (b): the owner stalls in its handler, after
// its INSERT, past its lease; a duplicate steals the record, pays and
// completes; the owner resumes and tries to commit. The fence refuses it:
// its payment rolls back, its client gets 503 lease_lost, and the key
// replays the thief's response.
func TestTxStolenFromStalledOwner(t *testing.T) {
	const lease = 400 * time.Millisecond
	b := newBank(t, bankConfig{lease: lease, wrap: func(s *pgstore.Store) idempotency.TxStore { return paused{s} }})
	entered, resume := make(chan struct{}), make(chan struct{})
	b.setHook(func(r *http.Request, tx pgx.Tx, info idempotency.Info) {
		if info.Epoch == 1 {
			close(entered)
			<-resume // a stalled owner does not look at its context
		}
	})
	owner := make(chan answer, 1)
	go func() { owner <- b.post("k-b") }()
	<-entered
	thief := b.postPast409("k-b")
	wantAnswer(t, "thief", thief, http.StatusCreated, "", false)
	if !strings.HasSuffix(thief.body, "epoch 2") {
		t.Fatalf("thief's answer %q", thief.body)
	}
	close(resume)
	wantAnswer(t, "stalled owner", <-owner, http.StatusServiceUnavailable, string(idempotency.CodeLeaseLost), false)
	dup := b.post("k-b")
	wantAnswer(t, "duplicate", dup, http.StatusCreated, "", true)
	if dup.body != thief.body {
		t.Fatalf("replay %q, the thief's answer %q", dup.body, thief.body)
	}
	var epoch int64
	if err := b.admin.QueryRow(ctx, `SELECT epoch FROM payments WHERE idem_key = 'k-b'`).Scan(&epoch); err != nil || epoch != 2 {
		t.Fatalf("the payment that stands: epoch %d, %v; want the thief's", epoch, err)
	}
	b.report("transaction: owner stalled past its lease, stolen", 3, []string{"k-b"},
		"1 row (the thief's); answers: thief 201, owner 503 lease_lost, duplicate replay")
}

// TestTxOwnerCommitsFirst (b, the other order): the owner's lease ran out
// but nobody took the record over; it resumes and its fence takes the row
// lock. A duplicate that arrives before the COMMIT waits for that lock,
// and then replays the owner's response instead of stealing: the row lock
// orders the fence before the steal.
func TestTxOwnerCommitsFirst(t *testing.T) {
	const lease = 1500 * time.Millisecond // the COMMIT must come within a third of it once the handler returned
	fenced, commit := make(chan struct{}), make(chan struct{})
	b := newBank(t, bankConfig{lease: lease, wrap: func(s *pgstore.Store) idempotency.TxStore {
		pgstore.SetBeforeCommit(s, func(*pgstore.Tx) {
			close(fenced)
			<-commit
		})
		return paused{s}
	}})
	entered, resume := make(chan struct{}), make(chan struct{})
	b.setHook(func(r *http.Request, tx pgx.Tx, info idempotency.Info) {
		close(entered)
		<-resume
	})
	owner := make(chan answer, 1)
	go func() { owner <- b.post("k-b2") }()
	<-entered
	waitFor(t, 5*time.Second, "the owner's lease to run out on the server", func() bool {
		var over bool
		err := b.admin.QueryRow(ctx, `SELECT lease_until < clock_timestamp() FROM idempotency_records WHERE key = $1`,
			idempotency.StorageKey("", "k-b2")).Scan(&over)
		return err == nil && over
	})
	close(resume)
	<-fenced
	dup := make(chan answer, 1)
	go func() { dup <- b.post("k-b2") }()
	waitingOnLocks(t, b.admin, 1)
	close(commit)
	first := <-owner
	wantAnswer(t, "owner", first, http.StatusCreated, "", false)
	second := <-dup
	t.Logf("the duplicate that waited for the owner's COMMIT answered %v", second)
	if second.status == http.StatusConflict {
		// Its statement's snapshot predates the COMMIT: in flight then.
		second = b.post("k-b2")
	}
	wantAnswer(t, "duplicate that waited for the owner's COMMIT", second, http.StatusCreated, "", true)
	if second.body != first.body {
		t.Fatalf("replay %q, the owner's answer %q", second.body, first.body)
	}
	b.report("transaction: owner past its lease commits while a duplicate waits", 3, []string{"k-b2"},
		"1 row (the owner's); the duplicate waited on the row lock, then replayed")
}

// TestTxBackendKilledAtCommit (c): the owner's backend is terminated
// between the fence and the COMMIT. Nothing committed: 503 outcome_unknown,
// then the retry runs once more and pays once.
func TestTxBackendKilledAtCommit(t *testing.T) {
	var b *bank
	var once sync.Once
	b = newBank(t, bankConfig{wrap: func(s *pgstore.Store) idempotency.TxStore {
		pgstore.SetBeforeCommit(s, func(tx *pgstore.Tx) {
			once.Do(func() { pgtest.Terminate(t, b.admin, tx.Handle().(pgx.Tx).Conn().PgConn().PID()) })
		})
		return s
	}})
	first := b.post("k-c1")
	wantAnswer(t, "owner whose COMMIT failed", first, http.StatusServiceUnavailable, string(idempotency.CodeOutcomeUnknown), false)
	retry := b.post("k-c1")
	wantAnswer(t, "retry", retry, http.StatusCreated, "", false)
	wantAnswer(t, "duplicate", b.post("k-c1"), http.StatusCreated, "", true)
	b.report("transaction: backend killed between the fence and the COMMIT", 3, []string{"k-c1"},
		"1 row; answers: 503 outcome_unknown, 201, replay")
}

// TestTxDeferredConstraintFailsCommit (c): the payment names an account
// that does not exist; the foreign key is deferred, so the COMMIT fails and
// rolls back the fence with the payment. The client gets 503
// outcome_unknown, the key is released, and a corrected retry (same
// fingerprint: the account is a header) pays once.
func TestTxDeferredConstraintFailsCommit(t *testing.T) {
	b := newBank(t, bankConfig{})
	first := b.post("k-c2", "X-Account", "999")
	wantAnswer(t, "payment to a missing account", first, http.StatusServiceUnavailable, string(idempotency.CodeOutcomeUnknown), false)
	if l := b.ledger(); l.rows["k-c2"] != 0 || l.complete[idempotency.StorageKey("", "k-c2")] {
		t.Fatalf("after the failed COMMIT: %d rows, complete %v", l.rows["k-c2"], l.complete)
	}
	wantAnswer(t, "corrected retry", b.post("k-c2"), http.StatusCreated, "", false)
	wantAnswer(t, "duplicate", b.post("k-c2"), http.StatusCreated, "", true)
	b.report("transaction: deferred constraint fails the COMMIT", 3, []string{"k-c2"},
		"0 rows after the failed COMMIT, 1 after the retry; answers: 503 outcome_unknown, 201, replay")
}

// TestTxCommitReplyLost (c): the COMMIT reaches the server and commits, but
// the connection is cut before its reply comes back. The outcome is
// unknown to the middleware: 503 outcome_unknown (its release is refused or
// fails, since the record is COMPLETE). The client's retry replays the
// committed response: one row.
func TestTxCommitReplyLost(t *testing.T) {
	var proxy *faultproxy.Proxy
	b := newBank(t, bankConfig{pool: func(t *testing.T, url string) *pgxpool.Pool {
		pool, p := pgtest.ProxiedPool(t, url, func(c *pgxpool.Config) { c.MaxConns = 16 })
		proxy = p
		return pool
	}})
	// pgx sends COMMIT as the simple query "commit"; the NUL that ends the
	// query string sets it apart from BEGIN's "read committed".
	cut := proxy.CutOn([]byte("commit\x00"), faultproxy.CutAfterReply)
	first := b.post("k-c3")
	select {
	case <-cut:
	case <-time.After(5 * time.Second):
		t.Fatal("the COMMIT never went through the proxy")
	}
	wantAnswer(t, "owner whose COMMIT reply was lost", first, http.StatusServiceUnavailable, string(idempotency.CodeOutcomeUnknown), false)
	proxy.Restore()
	if l := b.ledger(); l.rows["k-c3"] != 1 {
		t.Fatalf("%d rows: the COMMIT did not land", l.rows["k-c3"])
	}
	retry := b.postPast409("k-c3")
	wantAnswer(t, "retry", retry, http.StatusCreated, "", true)
	if !strings.HasSuffix(retry.body, "epoch 1") {
		t.Fatalf("replay %q", retry.body)
	}
	b.report("transaction: COMMIT landed, its reply lost", 2, []string{"k-c3"},
		"1 row; answers: 503 outcome_unknown, then the replay of the committed response")
}

// TestWaitAcrossTakeover: two duplicates wait (wait mode) for an owner that
// then fails and releases the key. One takes the record over, as a new row
// nobody has watched yet; the other finds it in flight, which marks it, and
// is woken by its completion: both answer long before the wait bound.
func TestWaitAcrossTakeover(t *testing.T) {
	b := newBank(t, bankConfig{})
	entered, resume := make(chan struct{}), make(chan struct{})
	b.setHook(func(r *http.Request, tx pgx.Tx, info idempotency.Info) {
		if r.Header.Get("X-Outcome") == "fail" {
			close(entered)
			<-resume
		}
	})
	owner := make(chan answer, 1)
	go func() { owner <- b.postTo("/wait", "k-w", "X-Outcome", "fail") }()
	<-entered
	waiters := make(chan answer, 2)
	for range 2 {
		go func() { waiters <- b.postTo("/wait", "k-w") }()
	}
	// Both wait, registered with the Store.
	waitFor(t, 5*time.Second, "the duplicates to wait", func() bool {
		return b.store.Waiters(idempotency.StorageKey("", "k-w")) == 2
	})
	if !rowWatched(t, b.admin, idempotency.StorageKey("", "k-w")) {
		t.Fatal("the record is not watched")
	}
	released := time.Now()
	close(resume)
	wantAnswer(t, "owner", <-owner, http.StatusBadGateway, "", false)
	var answers []answer
	for range 2 {
		answers = append(answers, <-waiters)
	}
	took := time.Since(released)
	fresh, replays := 0, 0
	for _, a := range answers {
		switch {
		case a.status == http.StatusCreated && a.replayed:
			replays++
		case a.status == http.StatusCreated:
			fresh++
		default:
			t.Errorf("waiter: %v", a)
		}
	}
	if fresh != 1 || replays != 1 || answers[0].body != answers[1].body {
		t.Fatalf("waiters got %v; want one fresh answer and its replay", answers)
	}
	if took > 2*time.Second {
		t.Fatalf("the waiters answered %v after the release: a notification was missed (wait bound 5s)", took)
	}
	b.report("wait mode: waiters across a release and a takeover", 3, []string{"k-w"},
		fmt.Sprintf("owner 502, one waiter ran, the other replayed %v after the release", took.Round(time.Millisecond)))
}

// TestHandlerCannotCommit: the handler's transaction refuses Commit (the
// middleware commits it with the record), and TxFromContext finds no
// transaction outside a transactional route.
func TestHandlerCannotCommit(t *testing.T) {
	b := newBank(t, bankConfig{})
	var commitErr error
	b.setHook(func(r *http.Request, tx pgx.Tx, info idempotency.Info) {
		commitErr = tx.Commit(r.Context())
	})
	wantAnswer(t, "payment", b.post("k-h"), http.StatusCreated, "", false)
	if !errors.Is(commitErr, pgstore.ErrHandlerCommit) {
		t.Fatalf("the handler's Commit: %v, want ErrHandlerCommit", commitErr)
	}
	if v := b.ledger().check("k-h"); len(v) > 0 || b.ledger().rows["k-h"] != 1 {
		t.Fatalf("ledger: %v", v)
	}
	if _, ok := pgstore.TxFromContext(context.Background()); ok {
		t.Fatal("a transaction outside a handler")
	}
	var inPlain bool
	h := idempotency.New(b.store)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, inPlain = pgstore.TxFromContext(r.Context())
	}))
	req := httptest.NewRequest(http.MethodPost, "/", nil)
	req.Header.Set(idempotency.HeaderKey, "k-plain")
	h.ServeHTTP(httptest.NewRecorder(), req)
	if inPlain {
		t.Fatal("a transaction on a route without WithTransaction")
	}
}
