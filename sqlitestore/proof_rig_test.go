package sqlitestore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/childproc"
	"github.com/go-idempotency/idempotency/sqlitestore"
)

// The proofs on a real file (proof_*_test.go): servers that keep their
// records in one SQLite file are child processes, this test binary
// running TestProofServerProcess, which the proofs kill with SIGKILL in
// the middle of a request and start again on the same file, or run two
// at once. Each request's handler writes an effect row in the request's
// transaction; the effects table has no unique constraint, so a second
// execution would show. The parent counts the rows and reads the records
// in the file itself, with a Store of its own.

// Environment of a server process of the proofs.
const (
	proofServerEnv = "SQLITESTORE_PROOF_SERVER" // the server's name; set, the process is a server
	proofFileEnv   = "SQLITESTORE_PROOF_FILE"   // the SQLite file
	proofLeaseEnv  = "SQLITESTORE_PROOF_LEASE"  // the middleware's lease (WithLease); default 10s
	proofPollEnv   = "SQLITESTORE_PROOF_POLL"   // WithPollInterval; default 0
)

// proofLinePrefix starts the lines a server process reports to its parent.
const proofLinePrefix = "SQLITEPROOF "

// Request headers by which a proof makes a server's handler misbehave.
// They are not part of the request's fingerprint: a retry without them
// is the same request.
const (
	// hangHeader: "handler" hangs the handler after its effect row (written
	// in the open transaction), once it reported HANDLER key; "reply" hangs
	// the response once the record and the row committed, before its first
	// byte reaches the client, once it reported COMMITTED key.
	hangHeader = "Proof-Hang"
	// pragmaHeader: a PRAGMA the handler runs after its effect row on the
	// connection the record is then written on: the request
	// transaction's, or on the plain route the Store's writer's.
	pragmaHeader = "Proof-Pragma"
	// bodyHeader: the number of bytes the response body is padded with.
	bodyHeader = "Proof-Body-Size"
)

// effectsSchema is the table of the handlers' effects: one row per
// execution, without a unique constraint.
const effectsSchema = `
CREATE TABLE effects (
	id       INTEGER PRIMARY KEY,
	idem_key TEXT    NOT NULL,
	epoch    INTEGER NOT NULL,
	process  TEXT    NOT NULL
)`

// execer is what a handler writes its effect with: the request's
// HandlerTx on a transactional route, the Store's DB on the plain one.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// TestProofServerProcess is a server process of the proofs, started by
// them (run by itself it is skipped). It serves, on a free loopback port,
// POST /pay (a transactional route), POST /wait (the same in wait mode)
// and POST /plain (not transactional: the effect row commits on its own,
// before the record), with a Store on the file the environment names, until
// SIGTERM. It reports READY addr, HANDLER key and COMMITTED key (see
// hangHeader), and EVENT kind status error for each event of the
// middleware that carries an error.
func TestProofServerProcess(t *testing.T) {
	name := os.Getenv(proofServerEnv)
	if name == "" {
		t.Skip("a server process of the proofs, started by them")
	}
	childproc.WatchLifeline()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	lease := 10 * time.Second
	if v := os.Getenv(proofLeaseEnv); v != "" {
		var err error
		if lease, err = time.ParseDuration(v); err != nil {
			t.Fatal(err)
		}
	}
	var opts []sqlitestore.Option
	if v := os.Getenv(proofPollEnv); v != "" {
		poll, err := time.ParseDuration(v)
		if err != nil {
			t.Fatal(err)
		}
		opts = append(opts, sqlitestore.WithPollInterval(poll))
	}
	store, err := sqlitestore.Open(os.Getenv(proofFileEnv), opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()

	out := &childproc.Reporter{Prefix: proofLinePrefix}
	observe := idempotency.WithObserver(func(_ context.Context, e idempotency.Event) {
		if e.Err != nil {
			out.Report("EVENT", "%s %d %s", e.Kind, e.Status, strings.ReplaceAll(e.Err.Error(), "\n", " "))
		}
	})
	s := &proofServer{name: name, db: store.DB(), store: store, out: out}
	common := []idempotency.Option{idempotency.WithLease(lease), observe}
	tx := slices.Concat(common, []idempotency.Option{idempotency.WithTransaction(true)})
	wait := slices.Concat(tx, []idempotency.Option{idempotency.WithWait(10 * time.Second)})
	mux := http.NewServeMux()
	mux.Handle("POST /pay", idempotency.New(store, tx...)(http.HandlerFunc(s.pay)))
	mux.Handle("POST /wait", idempotency.New(store, wait...)(http.HandlerFunc(s.pay)))
	mux.Handle("POST /plain", idempotency.New(store, common...)(http.HandlerFunc(s.pay)))

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: s.holdReply(mux)}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	out.Report("READY", "%s", ln.Addr())
	select {
	case err := <-served:
		t.Fatal(err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		t.Error(err)
	}
}

// proofServer is the handler of a server process.
type proofServer struct {
	name  string
	db    *sql.DB
	store *sqlitestore.Store
	out   *childproc.Reporter
}

// pay writes the effect row (in the request's transaction, or on its own
// on the plain route) and answers 201 with a body that names the
// execution: the key, the epoch, the process and the row's id.
func (s *proofServer) pay(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	info, _ := idempotency.FromContext(ctx)
	var db execer = s.db
	if tx, ok := sqlitestore.TxFromContext(ctx); ok {
		db = tx
	} else if r.URL.Path != "/plain" {
		http.Error(w, "no transaction on a transactional route", http.StatusInternalServerError)
		return
	}
	var id int64
	if err := db.QueryRowContext(ctx, `INSERT INTO effects (idem_key, epoch, process) VALUES (?, ?, ?) RETURNING id`,
		info.Key, int64(info.Epoch), s.name).Scan(&id); err != nil {
		http.Error(w, "effect: "+err.Error(), http.StatusInternalServerError)
		return
	}
	if p := r.Header.Get(pragmaHeader); p != "" {
		// The record is written on the Store's own writer: on a
		// transactional route in the request's transaction, which runs
		// on it; on the plain route after the handler, in the write turn.
		var err error
		if _, ok := sqlitestore.TxFromContext(ctx); ok {
			_, err = db.ExecContext(ctx, "PRAGMA "+p)
		} else {
			err = s.store.WriterExec(ctx, "PRAGMA "+p)
		}
		if err != nil {
			http.Error(w, "pragma: "+err.Error(), http.StatusInternalServerError)
			return
		}
	}
	if r.Header.Get(hangHeader) == "handler" {
		s.out.Report("HANDLER", "%s", info.Key)
		select {} // the effect written in the open transaction: killed here
	}
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "paid %s at epoch %d by %s, effect %d", info.Key, info.Epoch, s.name, id)
	if n, _ := strconv.Atoi(r.Header.Get(bodyHeader)); n > 0 {
		_, _ = w.Write([]byte(strings.Repeat(".", n)))
	}
}

// holdReply wraps the server's handler: a request whose hangHeader says
// "reply" hangs at the first write of its response, after reporting
// COMMITTED key. On a transactional route the middleware holds the whole
// response until the record and the handler's row have committed, and
// only then writes it here, so the hang comes after the commit and
// before the client got a byte. (An observer cannot stand in: the
// middleware reports a request's final event after it answered.)
func (s *proofServer) holdReply(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(hangHeader) == "reply" {
			w = &heldReply{ResponseWriter: w, hang: func() {
				s.out.Report("COMMITTED", "%s", r.Header.Get(idempotency.HeaderKey))
				select {} // committed, not answered: killed here
			}}
		}
		next.ServeHTTP(w, r)
	})
}

// heldReply is a ResponseWriter that hangs at its first write.
type heldReply struct {
	http.ResponseWriter
	hang func()
}

func (h *heldReply) WriteHeader(int)           { h.hang() }
func (h *heldReply) Write([]byte) (int, error) { h.hang(); return 0, nil }

// rig is a proof's file, the server processes on it, and their client.
type rig struct {
	t       *testing.T
	file    string
	store   *sqlitestore.Store // the parent's own, for counts and records
	lines   *childproc.Lines
	pending []childproc.Line // lines taken, not yet awaited
	client  *http.Client
	started int
}

// newRig creates the proof's file, with the records' table and the
// effects table.
func newRig(t *testing.T) *rig {
	t.Helper()
	file := filepath.Join(t.TempDir(), "proof.db")
	store, err := sqlitestore.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if _, err := store.DB().Exec(effectsSchema); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	t.Cleanup(client.CloseIdleConnections)
	return &rig{t: t, file: file, store: store, lines: childproc.NewLines(), client: client}
}

// proc is a server process of a rig.
type proc struct {
	*childproc.Process
	url string
}

// start starts a server process on the rig's file, with env added to its
// environment, and waits until it serves.
func (r *rig) start(env ...string) *proc {
	r.t.Helper()
	name := fmt.Sprintf("server-%d", r.started)
	r.started++
	bin, args := childproc.Self("TestProofServerProcess")
	env = append([]string{proofServerEnv + "=" + name, proofFileEnv + "=" + r.file}, env...)
	p := childproc.Start(r.t, name, proofLinePrefix, bin, args, env, r.lines)
	ready := r.await(p, "READY", "", 30*time.Second)
	return &proc{Process: p, url: "http://" + ready.Text}
}

// await returns the first line from p of kind (and text, unless empty)
// not awaited yet, waiting for at most d. It fails the test when p exits
// or d passes first.
func (r *rig) await(p *childproc.Process, kind, text string, d time.Duration) childproc.Line {
	r.t.Helper()
	return r.awaitMatch(p, kind, "text "+text, func(got string) bool { return text == "" || got == text }, d)
}

// awaitEvent returns the text of the first EVENT line from p that holds
// every one of parts, waiting for at most d.
func (r *rig) awaitEvent(p *childproc.Process, d time.Duration, parts ...string) string {
	r.t.Helper()
	return r.awaitMatch(p, "EVENT", fmt.Sprintf("holding %q", parts), func(got string) bool {
		for _, part := range parts {
			if !strings.Contains(got, part) {
				return false
			}
		}
		return true
	}, d).Text
}

// awaitMatch returns the first line from p of kind whose text match
// accepts, not awaited yet, waiting for at most d. It fails the test
// (saying it wanted what) when p exits or d passes first.
func (r *rig) awaitMatch(p *childproc.Process, kind, what string, match func(string) bool, d time.Duration) childproc.Line {
	r.t.Helper()
	l, _, _ := r.awaitOrReply(p, kind, what, match, d, nil)
	return l
}

// awaitOrReply is awaitMatch that also returns, with ok false, the reply
// that comes on replies first (a nil replies never comes).
func (r *rig) awaitOrReply(p *childproc.Process, kind, what string, match func(string) bool, d time.Duration, replies <-chan reply) (_ childproc.Line, _ reply, ok bool) {
	r.t.Helper()
	deadline := time.After(d)
	exited := false
	for {
		r.pending = append(r.pending, r.lines.Take()...)
		for i, l := range r.pending {
			if l.From == p && l.Kind == kind && match(l.Text) {
				r.pending = slices.Delete(r.pending, i, i+1)
				return l, reply{}, true
			}
		}
		if exited {
			r.t.Fatalf("%s exited without reporting %s %s", p.Name, kind, what)
		}
		select {
		case a := <-replies:
			return childproc.Line{}, a, false
		case <-r.lines.Notify:
		case <-p.Exited():
			exited = true // its last lines are in: look once more
		case <-deadline:
			r.t.Fatalf("%s did not report %s %s within %v (its other lines: %v)", p.Name, kind, what, d, r.linesOf(p))
		}
	}
}

// linesOf returns the lines from p not awaited yet, as text.
func (r *rig) linesOf(p *childproc.Process) []string {
	var got []string
	for _, l := range r.pending {
		if l.From == p {
			got = append(got, l.Kind+" "+l.Text)
		}
	}
	return got
}

// reply is what a client got.
type reply struct {
	status   int
	body     string
	replayed bool
	code     string    // the problem's code, for a problem
	at       time.Time // when the reply (or the error) came
	err      error
}

func (a reply) String() string {
	body := a.body
	if len(body) > 80 { // a padded body: its start says whose it is
		body = fmt.Sprintf("%s... (%d bytes)", body[:80], len(a.body))
	}
	switch {
	case a.err != nil:
		return "error: " + a.err.Error()
	case a.code != "":
		return fmt.Sprintf("%d %s", a.status, a.code)
	case a.replayed:
		return fmt.Sprintf("%d replay %q", a.status, body)
	}
	return fmt.Sprintf("%d %q", a.status, body)
}

// post sends a payment with key to path on the server at url, with extra
// headers as name, value pairs.
func (r *rig) post(url, path, key string, headers ...string) reply {
	req, err := http.NewRequest(http.MethodPost, url+path, strings.NewReader("amount=100"))
	if err != nil {
		return reply{err: err, at: time.Now()}
	}
	req.Header.Set(idempotency.HeaderKey, key)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := r.client.Do(req)
	if err != nil {
		return reply{err: err, at: time.Now()}
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	a := reply{status: res.StatusCode, body: string(body), replayed: res.Header.Get(idempotency.HeaderReplayed) == "true", at: time.Now(), err: err}
	if strings.HasPrefix(res.Header.Get("Content-Type"), "application/problem+json") {
		if _, rest, ok := strings.Cut(a.body, `"code":"`); ok {
			a.code, _, _ = strings.Cut(rest, `"`)
		}
	}
	return a
}

// effects returns the effect rows of key in the file, as "epoch process"
// each, in the order they were written.
func (r *rig) effects(key string) []string {
	r.t.Helper()
	rows, err := r.store.DB().Query(`SELECT epoch, process FROM effects WHERE idem_key = ? ORDER BY id`, key)
	if err != nil {
		r.t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var epoch int64
		var process string
		if err := rows.Scan(&epoch, &process); err != nil {
			r.t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%d %s", epoch, process))
	}
	if err := rows.Err(); err != nil {
		r.t.Fatal(err)
	}
	return got
}

// count returns the result of a query of one integer on the file.
func (r *rig) count(query string, args ...any) int {
	r.t.Helper()
	var n int
	if err := r.store.DB().QueryRow(query, args...).Scan(&n); err != nil {
		r.t.Fatal(err)
	}
	return n
}

// record returns the state and epoch of key's record row in the file
// ("" for no row).
func (r *rig) record(key string) (string, int64) {
	r.t.Helper()
	var state string
	var epoch int64
	err := r.store.DB().QueryRow(`SELECT state, epoch FROM `+sqlitestore.DefaultTable+` WHERE key = ?`,
		idempotency.StorageKey("", key)).Scan(&state, &epoch)
	if errors.Is(err, sql.ErrNoRows) {
		return "", 0
	}
	if err != nil {
		r.t.Fatal(err)
	}
	return state, epoch
}

// leaseEnd returns when the lease of key's record runs out, by the
// file's lease_until (unix microseconds of the machine's clock).
func (r *rig) leaseEnd(key string) time.Time {
	r.t.Helper()
	var until int64
	if err := r.store.DB().QueryRow(`SELECT lease_until FROM `+sqlitestore.DefaultTable+` WHERE key = ?`,
		idempotency.StorageKey("", key)).Scan(&until); err != nil {
		r.t.Fatal(err)
	}
	return time.UnixMicro(until)
}

// holdWriteLock takes the file's write lock (BEGIN IMMEDIATE) in the
// parent and gives it back after d, as another process's writer would
// whose commit waits that long for the disk: the servers' writes wait for
// it (in SQLite's busy handler) meanwhile.
func (r *rig) holdWriteLock(d time.Duration) {
	r.t.Helper()
	tx, err := r.store.DB().Begin()
	if err != nil {
		r.t.Fatal(err)
	}
	time.AfterFunc(d, func() { tx.Rollback() })
}

// wantReply fails the test unless a has status, the problem code code
// ("" for none) and replayed as given.
func wantReply(t *testing.T, who string, a reply, status int, code string, replayed bool) {
	t.Helper()
	if a.err != nil || a.status != status || a.code != code || a.replayed != replayed {
		t.Fatalf("%s: %v; want %d %s (replayed %v)", who, a, status, code, replayed)
	}
}
