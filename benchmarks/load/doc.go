// Package load drives an HTTP server that uses the idempotency middleware
// with a mix of first executions, duplicates and concurrent duplicates, and
// measures throughput and latency percentiles. It also builds the servers
// the measurements compare against: the bare handler and, for Redis, the
// bare handler plus the raw EVALSHA round trips a request would need at
// best.
//
// Everything runs on loopback: servers listen on 127.0.0.1 and Redis
// addresses outside loopback are refused.
package load
