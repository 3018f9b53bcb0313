// Package funcbench holds the benchmarks of idempotency.Do: the function API
// on memstore, Redis and PostgreSQL, in process, each beside the bare
// function and its record floor (the same function between the same store
// round trips, made by hand and checking nothing). The rows are reported,
// not judged. Run them from the benchmarks module:
//
//	go test -run '^$' -bench BenchmarkDo -benchmem ./funcbench/
package funcbench
