// Package statebench holds the benchmarks of package state on PostgreSQL.
// It has no code outside its tests:
//
//	go test -run '^$' -bench '^BenchmarkTransition$' -benchtime 2000x .
//	go test -run '^$' -bench '^BenchmarkRouteTransition$' -benchtime 1000x .
//
// BenchmarkTransition puts a Store's transition, with its event and its
// history row, beside its floor: the same compare-and-swap written by
// hand, an UPDATE ... WHERE state AND version with the event's INSERT into
// the outbox in one statement, so in the same round trips (one). Beside
// them, to show what each part costs: the floor with the history's INSERT
// added, and with the relays' wake-up (pg_notify) too, which is all a
// Store's transition does, by hand; and the Store without the wake-up.
// Every op makes one transition on each side, in an order that rotates
// from op to op, so that all sides meet the same background load; it
// reports each side's median and mean (µs/transition) and the Store's
// ratios to the floor (x-floor) and to its equivalent by hand
// (x-by-hand).
//
// BenchmarkRouteTransition puts a transactional route of the middleware
// that inserts a payment row beside the same route that also makes a
// transition in its transaction, over loopback HTTP, one request on each
// per op, and reports each side's median and mean (µs/request) and what
// the transition adds.
//
// Both run on a database of their own, created and dropped on the server
// of IDEMPOTENCY_POSTGRES_URL or the local one (internal/pgtest); without
// a server they are skipped.
package statebench
