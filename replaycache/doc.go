// Package replaycache is an opt-in, in-process cache of COMPLETE records in
// front of any idempotency.Store: duplicates of a completed request are
// replayed from memory, without a store call.
//
//	store := replaycache.New(redisstore.New(client))
//	mw := idempotency.New(store)
//
// A COMPLETE record does not change until it expires: its response and
// fingerprint are fixed. So once the store has answered Completed for a
// key, the cache answers the key's later duplicates itself, for as long as
// the record lives: Completed with the stored response when the request's
// fingerprint is the record's, Mismatch when it is not, exactly as the
// store would. Everything else (a new key, a record in flight, a lease,
// Complete, Release, Extend, Watch) goes to the store, unchanged. A retry
// storm on one hot key, the many duplicates that follow a client-side
// timeout, then costs the store one call per instance, not one per
// duplicate: callers that miss the same key at the same time share one
// store call when its answer is a COMPLETE record, and each make their own
// otherwise (see Cache.Acquire).
//
// # When an entry ends
//
// Only Completed answers that tell the record's expiry
// (idempotency.Acquisition.ExpiresIn, which the cache asks for with
// AcquireRequest.WantExpiresIn, and memstore, redisstore and pgstore fill)
// are kept. An entry ends at the earlier of:
//
//   - the record's expiry, counted on the local monotonic clock from when
//     the Acquire was sent (the store read its clock after that, so the
//     entry never outlives the record, as long as the two clocks run at
//     the same rate; over the maximum age their drift is microseconds);
//   - the maximum age (WithMaxAge, default 10 seconds) from the same
//     instant.
//
// The maximum age is the bound on staleness. A record that disappears
// before its expiry, deleted by an operator (idemctl delete) or lost with
// the store's data, is still replayed by every instance that cached it for
// up to that long: a client retrying within the window gets the old
// response rather than a new execution. Lower the maximum age if operators
// delete records to let requests run again, and wait that long after a
// deletion before telling a client to retry; or do not use the cache
// there.
//
// # Memory
//
// The cache is bounded in bytes (WithMaxBytes, default 64 MiB), counting
// keys, fingerprints, the stored status, headers and body, and a fixed
// estimate per entry, and evicts the least recently used entries to make
// room. The memory is per instance: every process holds its own copies of
// the records it replays, on top of the store's, and an instance that
// restarts starts empty (which costs store calls, nothing else). Each entry
// keeps its status and headers in one block of bytes that the garbage
// collector does not scan; every hit decodes a Response of its own from
// it, so no two replays share a Header map. The body is shared and must
// not be modified, as the Store contract says of every Response.
//
// # Transactions
//
// For a store that is an idempotency.TxStore (pgstore), use NewTx: the
// TxCache it returns is a TxStore too, so routes with
// idempotency.WithTransaction keep working behind the cache. A Cache made
// by New is not a TxStore, and idempotency.New panics when such a route is
// given one.
package replaycache
