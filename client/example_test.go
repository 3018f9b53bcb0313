package client_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/client"
	"github.com/go-idempotency/idempotency/memstore"
)

// A payment whose answer is lost on the way back is retried with the same
// key; the server replays the stored answer instead of charging again.
func Example() {
	store := memstore.New()
	defer store.Close()
	var executed atomic.Int64
	payments := idempotency.New(store)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "payment #%d", executed.Add(1))
	}))

	// The server loses its first answer: the payment runs, then the
	// connection drops before the client hears back.
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if requests.Add(1) == 1 {
			payments.ServeHTTP(httptest.NewRecorder(), r)
			if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
				conn.Close()
			}
			return
		}
		payments.ServeHTTP(w, r)
	}))
	defer srv.Close()

	hc := &http.Client{Transport: client.NewTransport(nil)}
	resp, err := hc.Post(srv.URL, "application/json", strings.NewReader(`{"amount":1234,"currency":"EUR"}`))
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)

	fmt.Println(resp.Status, string(body))
	fmt.Println("attempts:", client.Attempts(resp), "replayed:", client.Replayed(resp))
	fmt.Println("executed:", executed.Load())
	// Output:
	// 201 Created payment #1
	// attempts: 2 replayed: true
	// executed: 1
}

// Options tune which requests are covered and how long the Transport keeps
// trying.
func ExampleNewTransport() {
	hc := &http.Client{
		Transport: client.NewTransport(http.DefaultTransport,
			client.WithMethods(http.MethodPost, http.MethodPatch, http.MethodPut),
			client.WithBackoff(200*time.Millisecond, 10*time.Second),
			client.WithMaxAttempts(8),
			client.WithMaxElapsed(time.Minute),
		),
		Timeout: 2 * time.Minute, // bounds the whole call, waits included
	}
	_ = hc
}

// WithInfo reports the key and the attempts also when the call fails, here
// against a port where nothing listens.
func ExampleWithInfo() {
	ln := httptest.NewServer(http.NotFoundHandler())
	url := ln.URL
	ln.Close()

	var info client.Info
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader("{}"))
	req = req.WithContext(client.WithInfo(req.Context(), &info))
	hc := &http.Client{Transport: client.NewTransport(nil,
		client.WithMaxAttempts(3), client.WithBackoff(time.Millisecond, time.Millisecond))}
	if _, err := hc.Do(req); err != nil {
		fmt.Printf("failed after %d attempts; key set: %v\n", info.Attempts, info.Key != "")
	}
	// Output:
	// failed after 3 attempts; key set: true
}
