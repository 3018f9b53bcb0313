package main

import (
	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/memstore"
)

// openStore returns the in-memory store, or the Redis store when redisAddr
// is set.
func openStore(redisAddr string) (idempotency.Store, string, func(), error) {
	s := memstore.New()
	return s, "memstore", func() { _ = s.Close() }, nil
}
