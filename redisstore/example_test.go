package redisstore_test

import (
	"context"
	"log"
	"net/http"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/redisstore"
	"github.com/redis/go-redis/v9"
)

// A single Redis node.
func ExampleNew() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	store := redisstore.New(client)
	defer store.Close()

	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})
	log.Fatal(http.ListenAndServe(":8080", idempotency.New(store)(mux)))
}

// Sentinel: the failover client follows the master the sentinels elect.
func ExampleNew_sentinel() {
	client := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            "mymaster",
		SentinelAddrs:         []string{"10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"},
		ContextTimeoutEnabled: true, // the middleware's deadlines stop a call
	})
	defer client.Close()
	// WAIT narrows (does not close) the window in which a failover loses a
	// completed record.
	store := redisstore.New(client, redisstore.WithWAIT(1, 100*time.Millisecond))
	defer store.Close()
	_ = idempotency.New(store)
}

// Cluster: every record lives in its own key, so records spread over the
// masters; each script touches only its record's key.
func ExampleNew_cluster() {
	client := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"},
		ContextTimeoutEnabled: true,
		// Find a promoted replica within a second, for all of the client's traffic.
		ClusterStateReloadInterval: time.Second,
		// A master that hangs holds each call for ReadTimeout × (1 + MaxRedirects);
		// keep it above WithWAIT's timeout.
		ReadTimeout: time.Second,
	})
	defer client.Close()
	store := redisstore.New(client, redisstore.WithPrefix("payments-api:idem:"))
	defer store.Close()
	_ = idempotency.New(store)
}

// Observing replication shortfalls: Complete succeeds, the handler is told.
func ExampleWithWAITErrorHandler() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	store := redisstore.New(client,
		redisstore.WithWAIT(1, 50*time.Millisecond),
		redisstore.WithWAITErrorHandler(func(ctx context.Context, err *redisstore.WAITError) {
			log.Printf("idempotency record not replicated in time: %v", err)
		}),
	)
	defer store.Close()
	_ = idempotency.New(store)
}
