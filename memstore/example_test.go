package memstore_test

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/memstore"
)

func ExampleNew() {
	store := memstore.New(memstore.WithMaxEntries(100_000))
	defer store.Close()
	ctx := context.Background()

	req := idempotency.AcquireRequest{
		Key:         "3f1c0b9e",
		Token:       "attempt-1",
		Fingerprint: "sha256:body",
		Lease:       10 * time.Second,
		TTL:         24 * time.Hour,
	}
	first, _ := store.Acquire(ctx, req)
	fmt.Println("first:", first.Outcome, "epoch", first.Epoch)

	req.Token = "attempt-2"
	dup, _ := store.Acquire(ctx, req)
	fmt.Println("duplicate while running:", dup.Outcome)

	resp := &idempotency.Response{Status: http.StatusCreated, Body: []byte(`{"id":"pay_1"}`)}
	if err := store.Complete(ctx, req.Key, "attempt-1", resp, 24*time.Hour); err != nil {
		fmt.Println(err)
	}

	replay, _ := store.Acquire(ctx, req)
	fmt.Println("duplicate after completion:", replay.Outcome, replay.Response.Status, string(replay.Response.Body))

	req.Fingerprint = "sha256:other-body"
	other, _ := store.Acquire(ctx, req)
	fmt.Println("same key, other body:", other.Outcome)
	// Output:
	// first: acquired epoch 1
	// duplicate while running: in_flight
	// duplicate after completion: completed 201 {"id":"pay_1"}
	// same key, other body: mismatch
}
