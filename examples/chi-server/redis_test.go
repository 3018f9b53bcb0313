package main

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/internal/redistest"
)

// TestTwoServersShareRedis runs two API instances, each with its own Redis
// client and store, like two processes behind a load balancer: a duplicate
// sent to the second replays the first's response, and the payment ran once.
func TestTwoServersShareRedis(t *testing.T) {
	addr := redistest.Addr(t)
	var urls []string
	var apis []*api
	for i := 0; i < 2; i++ {
		b, err := openBackend(context.Background(), addr, "", slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.close)
		if b.name != "redis "+addr {
			t.Fatalf("store %q", b.name)
		}
		a := newAPI(b, slog.New(slog.DiscardHandler))
		srv := httptest.NewServer(a.routes())
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
		apis = append(apis, a)
	}
	key := "order-" + redistest.Prefix() // unique on a shared REDIS_ADDR
	const body = `{"amount":1999,"currency":"EUR"}`
	first, firstBody := client{t, urls[0]}.post("/payments", aliceToken, key, body)
	// The first server stores the record once its client has the response:
	// a duplicate in that moment gets 409, as a retrying client would.
	second, secondBody := client{t, urls[1]}.post("/payments", aliceToken, key, body)
	for deadline := time.Now().Add(5 * time.Second); second.StatusCode == 409 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		second, secondBody = client{t, urls[1]}.post("/payments", aliceToken, key, body)
	}
	if first.StatusCode != 201 || second.StatusCode != 201 {
		t.Fatalf("statuses %d %d", first.StatusCode, second.StatusCode)
	}
	if secondBody != firstBody || second.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("second server did not replay the first's response: %q vs %q", secondBody, firstBody)
	}
	if n0, n1 := apis[0].executed.Load(), apis[1].executed.Load(); n0 != 1 || n1 != 0 {
		t.Fatalf("executions %d and %d, want 1 and 0", n0, n1)
	}
}

// TestRedisTakesPrecedence: with REDIS_ADDR and DATABASE_URL both set, the
// server uses Redis and never connects to the database (here, a port where
// nothing listens).
func TestRedisTakesPrecedence(t *testing.T) {
	addr := redistest.Addr(t)
	b, err := openBackend(context.Background(), addr, "postgres://nobody@127.0.0.1:1/none?connect_timeout=1", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	if b.name != "redis "+addr || b.db != nil {
		t.Fatalf("store %q, database %v", b.name, b.db)
	}
}
