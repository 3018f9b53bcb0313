// Package idempotency is net/http middleware for the Idempotency-Key header.
//
// A client sends an unsafe request (POST or PATCH by default) with a key. The
// middleware runs the handler once, stores the response (status, headers,
// body) as the key's COMPLETE record and replays it to every duplicate for the
// record's TTL. A duplicate that arrives while the original still runs gets
// 409 Conflict, or waits for it when wait mode is on. A 5xx response or a
// panic releases the key, so the client's retry runs the handler again.
//
// The response reaches the client whole, and flushed, before the record is
// written. The middleware never believes in more lease than the store
// granted: it counts a lease from before the call that took or extended it
// was sent, starts the handler only with half the lease left, bounds every
// extend by the lease's end and cancels the handler's context (with a cause
// wrapping ErrLeaseLost) before another request could take the record over.
//
// Do gives any function the same guarantee: it runs once per key, its
// result is stored and replayed to duplicates, an error releases the key.
// The middleware and Do share one implementation of the record's lease,
// heartbeat, fencing and completion.
//
// Records live in a Store: package memstore is the in-process store,
// package redisstore keeps them in Redis (single node, Sentinel or
// Cluster) and package pgstore in PostgreSQL, where a handler's or a
// function's own writes can commit with the record (WithTransaction).
//
// Without WithKeyScope, anyone who learns a key can read the response stored
// under it: scope keys to the authenticated principal.
package idempotency
