// Command chi-server is a small payments API protected by the idempotency
// middleware: POST /payments needs an Idempotency-Key and runs once per key;
// duplicates replay the stored response.
//
//	go run ./examples/chi-server                                            # in-memory store
//	go run ./examples/chi-server -sqlite payments.db                        # SQLite store: one file, kept across restarts
//	REDIS_ADDR=127.0.0.1:6379 go run ./examples/chi-server                  # Redis store
//	DATABASE_URL=postgres://app@127.0.0.1/app go run ./examples/chi-server  # PostgreSQL store
//	DATABASE_URL=postgres://app@127.0.0.1/app NATS_URL=nats://127.0.0.1:4222 go run ./examples/chi-server  # and payment.created messages
//
// -sqlite (whose default is $SQLITE_PATH) takes precedence over
// REDIS_ADDR, which takes precedence over DATABASE_URL; with none set, the
// records live in memory. The banner says which store is used.
//
// With -sqlite FILE the records (package sqlitestore), the payments,
// their state records and their outbox live in that SQLite file, created
// if missing: the handlers are PostgreSQL mode's, each payment a row of
// its payments table inserted in the request's transaction, and its
// scheduled capture, its cancel and its state record below work as they
// do there, the store's relay (sqlitestore's Store.Relay) running the
// captures from the file. All of it survives a restart: a server started
// again on the same file replays the responses of the first, and runs the
// captures the first scheduled when they fall due, once. The
// payment.created messages (NATS_URL) are PostgreSQL mode's alone.
//
// With DATABASE_URL the server creates its tables (pgstore.Migrate and a
// payments table) and each payment is a row, inserted in the request's
// transaction (idempotency.WithTransaction): the row and the key's record
// commit together, so a payment is made once however often it is sent,
// and a payment whose provider fails (a 5xx) leaves no row.
//
// The payments routes authenticate each request with a bearer token from
// a fixed demo table (alice-token for alice, bob-token for bob) before the
// idempotency middleware runs; a request without a valid token gets 401.
// The middleware's scope (idempotency.WithKeyScope) is the user that
// authentication put in the request's context, never a header the client
// chose: each user's keys and stored responses are their own. GET /stats
// needs no token.
//
// In PostgreSQL and SQLite modes a payment is authorized, and its
// capture scheduled -capture-after later (default 30s): an outbox message
// enqueued in the payment's transaction with a NotBefore, which the
// server's own relay runs when it falls due as a local run (package
// outbox/local), the capture's UPDATE and the message's done mark in one
// transaction, once. Until then POST /payments/{id}/capture captures it
// now and POST /payments/{id}/cancel cancels it, each canceling the
// scheduled capture (outbox.Cancel) in a transactional route of its own.
// Each payment is also a state record (package state: machine
// payments.payment, scope its user), created authorized at version 1
// with the payment; a capture and a cancel are transitions from
// authorized, at the version the client sends as If-Match (or the
// current one), so that of a capture and a cancel sent with different
// keys exactly one wins, and the other is answered 409 state_conflict
// with the winner's state and version. GET /payments/{id} shows the
// payment's status (authorized, captured or canceled) and its record's
// state and version; in PostgreSQL mode, go run ./cmd/idemctl state shows
// the record's transitions and where their events are.
//
// With NATS_URL set as well, in PostgreSQL mode, each payment also
// enqueues a payment.created message in its transaction (outbox.Enqueue),
// which commits with the row and the record or not at all. The server
// itself never connects to NATS: a relay publishes the outbox to JetStream
// (brokers/nats/cmd/natsrelay), and examples/payments-consumer applies
// each message once. The banner prints both commands. A relay serves
// every message of its outbox table, so the server then schedules no
// captures of its own: payments are captured as they are made.
//
// It listens on -addr (or $ADDR; default 127.0.0.1:8080) and prints curl
// commands that show a first call, a replay, a 422, a 409, a 502, another
// user's key space and a 401, in PostgreSQL and SQLite modes the
// capture, its cancel, and a capture and a cancel racing, and in SQLite
// mode the replay and the scheduled capture after a restart.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/go-idempotency/idempotency/outbox/relay"
)

func main() {
	defaultAddr := os.Getenv("ADDR")
	if defaultAddr == "" {
		defaultAddr = "127.0.0.1:8080"
	}
	addr := flag.String("addr", defaultAddr, "listen address (also $ADDR)")
	sqlitePath := flag.String("sqlite", os.Getenv("SQLITE_PATH"), "SQLite mode: the file of the records, the payments, their state records and their scheduled captures, created if missing (also $SQLITE_PATH)")
	captureAfter := flag.Duration("capture-after", 30*time.Second, "PostgreSQL and SQLite modes: how long after a payment its capture runs, cancelable until then")
	flag.Parse()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if *captureAfter <= 0 {
		logger.Error("chi-server: -capture-after must be positive")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, settings{
		addr:         *addr,
		redisAddr:    os.Getenv("REDIS_ADDR"),
		databaseURL:  os.Getenv("DATABASE_URL"),
		natsURL:      os.Getenv("NATS_URL"),
		sqlitePath:   *sqlitePath,
		captureAfter: *captureAfter,
	}, os.Stdout, logger)
	stop()
	if err != nil {
		logger.Error("chi-server", "error", err)
		os.Exit(1)
	}
}

// settings are the server's flags and environment.
type settings struct {
	addr         string        // -addr, or $ADDR
	redisAddr    string        // $REDIS_ADDR
	databaseURL  string        // $DATABASE_URL
	natsURL      string        // $NATS_URL
	sqlitePath   string        // -sqlite, or $SQLITE_PATH
	captureAfter time.Duration // -capture-after
	// captureRelay adds to the options of the captures' relay (the tests
	// observe it).
	captureRelay []relay.Option
}

// run serves the API as s says until ctx ends (main's ends on SIGINT or
// SIGTERM), printing the banner to out; then it shuts the server down,
// letting the requests in progress finish, and closes the store.
func run(ctx context.Context, s settings, out io.Writer, logger *slog.Logger) error {
	var b *backend
	var err error
	if s.sqlitePath != "" {
		b, err = openSQLite(context.Background(), s.sqlitePath, logger)
	} else {
		b, err = openBackend(context.Background(), s.redisAddr, s.databaseURL, logger)
	}
	if err != nil {
		return err
	}
	defer b.close()
	switch {
	case s.sqlitePath != "" && (s.redisAddr != "" || s.databaseURL != ""):
		logger.Warn("-sqlite (or SQLITE_PATH) is set and takes precedence: REDIS_ADDR and DATABASE_URL are not used")
	case s.redisAddr != "" && s.databaseURL != "":
		logger.Warn("REDIS_ADDR and DATABASE_URL are both set: REDIS_ADDR takes precedence, DATABASE_URL is not used")
	}

	if s.natsURL != "" && b.db == nil {
		logger.Warn("NATS_URL is set but the store is not PostgreSQL: payments enqueue no payment.created messages (they need DATABASE_URL, and no REDIS_ADDR or -sqlite)")
	}

	api := newAPI(b, logger)
	api.events = s.natsURL != "" && b.db != nil
	if b.payments != nil && !api.events {
		api.captureAfter = s.captureAfter
	}
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		return err
	}
	srv := newServer(api.routes())
	printUsage(out, ln.Addr().String(), b, api)

	if api.captureAfter > 0 {
		// The relay of the captures runs until the server has shut down,
		// and hands back the captures it has not begun.
		captures := newCaptureRelay(b, logger, s.captureRelay...)
		rctx, stopCaptures := context.WithCancel(context.Background())
		relayed := make(chan error, 1)
		go func() { relayed <- captures.Run(rctx) }()
		defer func() {
			stopCaptures()
			<-relayed
		}()
	}

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// newServer returns the HTTP server of handler, with its timeouts.
func newServer(handler http.Handler) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		// A body trickled in slowly holds a connection, and up to the 1 MiB
		// the middleware buffers to fingerprint it, until this passes.
		ReadTimeout: 30 * time.Second,
		IdleTimeout: 2 * time.Minute,
		// No WriteTimeout: a slow payment (?delay=, up to 10s) must still
		// deliver its answer, which the middleware stores once written.
	}
}

// tokens describes the demo's accounts for the banner.
func tokens() string {
	var b strings.Builder
	b.WriteString("Users and their bearer tokens:")
	for _, a := range accounts {
		fmt.Fprintf(&b, " %s (%s)", a.user, a.token)
	}
	return b.String()
}

func printUsage(out io.Writer, addr string, b *backend, a *api) {
	base := "http://" + addr
	executions := "Payments made so far:"
	if b.payments != nil {
		executions = "Payments made so far (rows of the payments table):"
	}
	fmt.Fprintf(out, `chi-server listening on %[1]s (store: %[2]s)
%[4]s

First call (runs the payment):
  curl -i -X POST %[1]s/payments -H 'Authorization: Bearer alice-token' -H 'Idempotency-Key: order-1001' -d '{"amount":1999,"currency":"EUR"}'
Replay (same key, same body: the stored response, Idempotent-Replayed: true):
  curl -i -X POST %[1]s/payments -H 'Authorization: Bearer alice-token' -H 'Idempotency-Key: order-1001' -d '{"amount":1999,"currency":"EUR"}'
422 (same key, different body):
  curl -i -X POST %[1]s/payments -H 'Authorization: Bearer alice-token' -H 'Idempotency-Key: order-1001' -d '{"amount":5000,"currency":"EUR"}'
409 (a duplicate while a slow original still runs; run both lines together):
  curl -s -X POST '%[1]s/payments?delay=3s' -H 'Authorization: Bearer alice-token' -H 'Idempotency-Key: order-1002' -d '{"amount":10,"currency":"EUR"}' &
  sleep 0.5; curl -i -X POST '%[1]s/payments?delay=3s' -H 'Authorization: Bearer alice-token' -H 'Idempotency-Key: order-1002' -d '{"amount":10,"currency":"EUR"}'
502 (the payment provider fails: nothing is kept, and the key is released, so a retry runs again):
  curl -i -X POST '%[1]s/payments?provider=down' -H 'Authorization: Bearer alice-token' -H 'Idempotency-Key: order-1003' -d '{"amount":10,"currency":"EUR"}'
Bob's order-1001 is a payment of his own (keys are scoped to the authenticated user):
  curl -i -X POST %[1]s/payments -H 'Authorization: Bearer bob-token' -H 'Idempotency-Key: order-1001' -d '{"amount":1999,"currency":"EUR"}'
401 (X-User is no credential: without a valid token the request never reaches the middleware):
  curl -i -X POST %[1]s/payments -H 'X-User: alice' -H 'Idempotency-Key: order-1001' -d '{"amount":1999,"currency":"EUR"}'
%[3]s
  curl -s %[1]s/stats
`, base, b.name, executions, tokens())
	if a.captureAfter > 0 {
		fmt.Fprintf(out, `
Each payment is authorized, and captured %[2]v later by the server's relay, once, unless captured or canceled
before (the first call's payment is pay_1 on a new database: its Location header says):
  curl -s %[1]s/payments/pay_1 -H 'Authorization: Bearer alice-token'     # "status": "authorized", then "captured"; "state", "version"
Cancel (200 and "status": "canceled" while the payment is authorized; 409 state_conflict once it is not):
  curl -i -X POST %[1]s/payments/pay_1/cancel -H 'Authorization: Bearer alice-token' -H 'Idempotency-Key: cancel-1001'
A capture and a cancel of one payment at once, with different keys, each at the version read (If-Match: 1):
one wins (200), the other answers 409 state_conflict with the winner's state at version 2. Run the lines together:
  ID=$(curl -s -X POST %[1]s/payments -H 'Authorization: Bearer alice-token' -H 'Idempotency-Key: order-1004' -d '{"amount":500,"currency":"EUR"}' | sed 's/.*"id":"\([^"]*\)".*/\1/'); echo $ID
  curl -s -X POST %[1]s/payments/$ID/capture -H 'Authorization: Bearer alice-token' -H 'Idempotency-Key: capture-1004' -H 'If-Match: 1' & \
  curl -s -X POST %[1]s/payments/$ID/cancel -H 'Authorization: Bearer alice-token' -H 'Idempotency-Key: cancel-1004' -H 'If-Match: 1'; wait; echo
A duplicate of either (same key) replays its answer, the winner's 200 as the loser's 409 (Idempotent-Replayed: true):
  curl -i -X POST %[1]s/payments/$ID/capture -H 'Authorization: Bearer alice-token' -H 'Idempotency-Key: capture-1004' -H 'If-Match: 1'
  curl -i -X POST %[1]s/payments/$ID/cancel -H 'Authorization: Bearer alice-token' -H 'Idempotency-Key: cancel-1004' -H 'If-Match: 1'
`, base, a.captureAfter)
		if b.db != nil {
			fmt.Fprint(out, `The payment's state record, its transitions and their events (from the repository's root, with the same DATABASE_URL):
  go run ./cmd/idemctl state -scope alice -machine payments.payment -id $ID
`)
		}
	}
	if b.file != "" {
		fmt.Fprintf(out, `
The records and the payments are rows of %[2]s: stop the server (Ctrl-C) and start it again with the same
file (-sqlite %[2]s), and the first call's curl line answers Idempotent-Replayed: true, its payment made once:
  curl -i -X POST %[1]s/payments -H 'Authorization: Bearer alice-token' -H 'Idempotency-Key: order-1001' -d '{"amount":1999,"currency":"EUR"}'
`, base, b.file)
		if a.captureAfter > 0 {
			fmt.Fprintf(out, `The state records and the scheduled captures are rows of the file too: a capture scheduled before the stop
runs after the restart, when it falls due, once (the relay finds it in the file):
  curl -s %[1]s/payments/pay_1 -H 'Authorization: Bearer alice-token'     # "status": "captured", "state": "captured", "version": 2
`, base)
		}
	}
	if a.events {
		fmt.Fprint(out, `
Each payment also enqueues payment.created in its transaction. From the repository's root, with the
same DATABASE_URL and NATS_URL, relay the outbox to JetStream and apply each message once:
  go -C brokers/nats run ./cmd/natsrelay -stream PAYMENTS -subjects 'payment.>'
  go -C examples/payments-consumer run .
`)
	}
}
