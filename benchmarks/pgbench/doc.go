// Package pgbench holds the benchmarks of the middleware over pgstore that
// compare it with its floors, side by side: the bare handler with a
// trivial round trip, the record floor (plain pgx statements on a table of
// the store's schema: the least any store keeping its records in
// PostgreSQL rows must do), the store's own calls without the middleware,
// and the middleware; and, for transactional completion, the handler
// writing its row in its own transaction without the middleware. It has no
// code outside its tests:
//
//	go test -run '^$' -bench 'MiddlewarePostgres' -benchmem .
//
// Each benchmark runs on a database of its own, created and dropped on the
// server of IDEMPOTENCY_POSTGRES_URL or the local one (internal/pgtest);
// without a server the benchmarks are skipped.
package pgbench
