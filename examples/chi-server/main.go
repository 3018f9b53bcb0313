// Command chi-server is a small payments API protected by the idempotency
// middleware: POST /payments needs an Idempotency-Key and runs once per key;
// duplicates replay the stored response.
//
//	go run ./examples/chi-server                       # in-memory store
//	REDIS_ADDR=127.0.0.1:6379 go run ./examples/chi-server   # Redis store
//
// It listens on -addr (or $ADDR; default 127.0.0.1:8080) and prints curl
// commands that show a first call, a replay, a 422 and a 409.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	defaultAddr := os.Getenv("ADDR")
	if defaultAddr == "" {
		defaultAddr = "127.0.0.1:8080"
	}
	addr := flag.String("addr", defaultAddr, "listen address (also $ADDR)")
	flag.Parse()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(*addr, os.Getenv("REDIS_ADDR"), logger); err != nil {
		logger.Error("chi-server", "error", err)
		os.Exit(1)
	}
}

func run(addr, redisAddr string, logger *slog.Logger) error {
	store, storeName, closeStore, err := openStore(redisAddr)
	if err != nil {
		return err
	}
	defer closeStore()

	api := newAPI(store, logger)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: api.routes(), ReadHeaderTimeout: 10 * time.Second}
	printUsage(ln.Addr().String(), storeName)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
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

func printUsage(addr, storeName string) {
	base := "http://" + addr
	fmt.Printf(`chi-server listening on %[1]s (store: %[2]s)

First call (runs the payment):
  curl -i -X POST %[1]s/payments -H 'X-User: alice' -H 'Idempotency-Key: order-1001' -d '{"amount":1999,"currency":"EUR"}'
Replay (same key, same body: the stored response, Idempotent-Replayed: true):
  curl -i -X POST %[1]s/payments -H 'X-User: alice' -H 'Idempotency-Key: order-1001' -d '{"amount":1999,"currency":"EUR"}'
422 (same key, different body):
  curl -i -X POST %[1]s/payments -H 'X-User: alice' -H 'Idempotency-Key: order-1001' -d '{"amount":5000,"currency":"EUR"}'
409 (a duplicate while a slow original still runs; run both lines together):
  curl -s -X POST '%[1]s/payments?delay=3s' -H 'X-User: alice' -H 'Idempotency-Key: order-1002' -d '{"amount":10,"currency":"EUR"}' &
  sleep 0.5; curl -i -X POST '%[1]s/payments?delay=3s' -H 'X-User: alice' -H 'Idempotency-Key: order-1002' -d '{"amount":10,"currency":"EUR"}'
Handler executions so far:
  curl -s %[1]s/stats
`, base, storeName)
}
