// Package load drives an HTTP server that uses the idempotency middleware
// with a mix of first executions, duplicates and concurrent duplicates, and
// measures throughput and latency percentiles. It also builds the servers
// the measurements compare against: the bare handler and, for Redis, the
// record floor (the bare handler with the least a store keeping its
// records in Redis hashes does).
//
// Everything runs on loopback: servers listen on 127.0.0.1 and Redis
// addresses outside loopback are refused.
package load
