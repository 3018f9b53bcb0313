// Package redisstore is an idempotency.Store that keeps records in Redis:
// a single node, a Sentinel-managed master (redis.NewFailoverClient) or a
// Cluster (redis.NewClusterClient), all through redis.UniversalClient.
//
//	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
//	store := redisstore.New(client)
//	defer store.Close()
//	mw := idempotency.New(store)
//
// # Records
//
// Each record is one hash at prefix + storage key (WithPrefix; the storage
// key is the hex SHA-256 the middleware derives, so no client bytes reach
// key names), with these fields:
//
//	h               the head: <state><token length>:<token><epoch>:<lease end>:<fingerprint>,
//	                state "p" (in progress), "P" (in progress, watched by a
//	                waiter) or "c" (complete); epoch 1 for the first lease,
//	                +1 for each steal (1 to 15 decimal digits, no leading
//	                zero); lease end the lease's end in Unix milliseconds
//	                on the server's clock (1 to 15 digits, no leading zero)
//	c<fingerprint>  complete only: the payload, the meta block's length (a
//	                uvarint), the meta block (status, flags and headers) and
//	                the body, raw
//
// An in-progress record's key expires at the later of its lease's end and
// its TTL deadline. Taking, stealing and extending a lease write its end as
// the server's TIME plus the lease, and every acquire compares the end with
// TIME, so a person reads the lease's end in redis-cli as it is (HGET key h,
// then TIME). Extending the lease rewrites the end and pushes the key's
// expiry out when the new lease ends later. A complete record's
// key gets PEXPIRE ttl, its only deadline, and a replay asked for it
// (AcquireRequest.WantExpiresIn) reports its PTTL as Acquisition.ExpiresIn
// (0, unknown, for a key made persistent by hand). So
// Redis itself purges records. A replay reads only the payload field its
// own fingerprint names. The Go side of the layout is internal/redisrecord.
//
// The scripts parse the numbers strictly (Lua's tonumber would also take
// " 1", "1.5", "1e3", "0x10", "nan" or "inf"). A value under a record key
// that is not such a hash, or whose fields are not in these forms, is
// reported as an error wrapping idempotency.ErrCorruptRecord and left
// untouched, expiry included.
//
// # Scripts and round trips
//
// Every edge (acquire and steal, complete, release, extend) is one Lua
// script touching only the record's key, sent with EVALSHA (EVAL when the
// server answers NOSCRIPT, as after a restart or failover). Each script's
// header lists its KEYS, ARGV and replies; a reply is an array opening with
// a code, which the header names by its Go constant in scripts.go. Leases
// are judged on the server's clock (TIME), so application clocks do not
// matter. A replay costs one round trip (the acquire reply
// carries the payload) and one command inside the script (HGET; a PTTL too
// when the caller asks for the record's time left); a
// first execution two round trips (acquire, complete).
//
// Every script gives the same answer when run again with the same
// arguments, as go-redis does by itself after a read timeout. A retried
// acquire by the token holding the record answers acquired (or stolen)
// again with the same epoch and renews the lease to run its full length
// from now when it would end sooner, even if it had already run out, as
// long as no other token took the record over; it never shortens a lease.
// So a retry after Redis stalled for longer than the lease does not hand
// out a lease that has already run out.
//
// # Waiting
//
// Complete and release PUBLISH on the channel prefix + storage key +
// ":changed" when a waiter has marked the record as watched. Watch
// subscribes to it over one pub/sub connection shared by all waiters of a
// Store and, once Redis has confirmed the subscription, marks the record.
// A record nobody waits for is completed without a PUBLISH, which a Cluster
// would broadcast to every node. Close stops that connection.
//
// # Durability
//
// Configure the server with maxmemory-policy noeviction: an evicted record
// lets a duplicate run the handler a second time. With noeviction a full
// server refuses new records, and Acquire reports idempotency.ErrStoreFull;
// Acquire's read-only answers (replay, in flight, mismatch) still work.
// From Redis 7 on, a record already held can still be extended, completed
// and released on a full server: the complete, extend and release scripts
// open with the flags line "#!lua flags=allow-oom". A steal, a new record
// and a holder's retry that renews its lease are refused, as is the mark
// Watch writes (waiters then re-check when the holder's lease runs out).
//
// Only a small payload is written past maxmemory: one of at most
// WithMaxmemoryAllowance bytes (4 KiB by default; the status, headers and
// body as stored). A larger one is sent with a complete script without
// allow-oom, which Redis refuses at maxmemory before it runs; Complete then
// stores, in a second round trip, the status and headers with the body
// omitted (Response.BodyOmitted) when they fit in the allowance, else the
// status alone (Response.HeaderOmitted). The record is COMPLETE either way,
// and a duplicate gets that marked replay rather than a second execution.
// Since a full server refuses new records, only the records in progress
// when it filled up can complete past maxmemory, so it goes past by at most
// their number times the allowance (plus each record's overhead, see
// WithMaxmemoryAllowance) and the one larger payload Redis admitted while
// it was below.
//
// Servers before Redis 7 refuse to compile a script with a flags line; a
// Store that meets that error switches, once, to the same scripts without
// it. Such a server refuses Complete, whatever the payload's size, and
// Extend at maxmemory (Release still works): the record stays in progress,
// and once its lease has run out and the server has room, a duplicate runs
// the handler again.
//
// Redis replicates asynchronously. A failover can lose the writes the old
// master had not yet sent to the promoted replica, so a record completed
// just before it may be gone and a duplicate may then run the handler again.
// WithWAIT makes Complete wait until the given number of replicas
// acknowledged the record, which shrinks that window; it is not strong
// consistency (a WAIT that times out still leaves the write on the master,
// and Redis may still promote a replica that missed it).
//
// # Checking the server
//
// New sends nothing to Redis, and the Store sends only what its calls need
// (the scripts, WAIT, pub/sub for waiters), so a user that may not run INFO
// or CONFIG GET, as managed services and restricted ACLs have it, can use
// it. Whether the
// server keeps records safely (noeviction, persistence, replication
// settings) is checked by package servercheck, which the operator tool
// (cmd/idemctl check) runs and an application can call at start-up.
package redisstore
