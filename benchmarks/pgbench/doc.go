// Package pgbench holds the PostgreSQL benchmark of pgstore against the
// number of live records (BenchmarkKeyCount). It has no code outside its
// tests:
//
//	go test -run '^$' -bench KeyCount -benchtime 1000x .
//
// It runs on a database of its own, created and dropped on the server of
// IDEMPOTENCY_POSTGRES_URL or the local one (internal/pgtest); without a
// server it is skipped.
package pgbench
