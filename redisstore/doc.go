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
//	state       "in_progress" or "complete"
//	token       lease token of the holder (of the completer, once complete)
//	fp          request fingerprint
//	epoch       1 for the first lease, +1 for each steal
//	lease       "seconds:microseconds:ms": the server's TIME when the lease
//	            was taken or extended, and its length; it ends at that time
//	            plus ms (read while in_progress; a complete record keeps its
//	            last lease, unread)
//	meta        status, flags and headers, in a compact versioned binary block (complete only)
//	body        the response body, raw (complete only)
//
// An in-progress record keeps no TTL deadline of its own: its key expires
// at the later of its lease and its TTL deadline, and extending the lease
// pushes that out when the new lease ends later. A complete record's key
// gets PEXPIRE ttl, its only deadline. So Redis itself purges records.
//
// # Scripts and round trips
//
// Every edge (acquire and steal, complete, release, extend) is one Lua
// script touching only the record's key, sent with EVALSHA (EVAL when the
// server answers NOSCRIPT, as after a restart or failover). The scripts read
// the server's clock with TIME, so application clocks do not matter. A
// replay costs one round trip (the acquire reply carries the payload); a
// first execution two (acquire, complete).
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
// server refuses new records, and Acquire reports idempotency.ErrStoreFull.
//
// Redis replicates asynchronously. A failover can lose the writes the old
// master had not yet sent to the promoted replica, so a record completed
// just before it may be gone and a duplicate may then run the handler again.
// WithWAIT makes Complete wait until the given number of replicas
// acknowledged the record, which shrinks that window; it is not strong
// consistency (a WAIT that times out still leaves the write on the master,
// and Redis may still promote a replica that missed it).
package redisstore
