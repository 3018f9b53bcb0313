// Package httpbench holds the benchmarks that put the middleware beside its
// record floors and its peers over loopback HTTP. It has no code outside
// its tests:
//
//	go test -run '^$' -bench '^BenchmarkHTTP$' -benchtime 250x . -args -rounds 30
//	go test -run '^$' -bench '^BenchmarkPeers$' -benchtime 250x . -args -rounds 30
//
// Each comparison is a group of sides (the middleware, its record floor,
// the bare handler, a peer), each served by a server of its own on
// 127.0.0.1 and driven by the same client code. A round measures every
// side of every group once, in an order that rotates from round to round,
// so that the sides of a group meet the same background load; the rounds
// are sub-benchmarks (round=N) that benchstat folds together with
// -ignore /round. Redis parts start a private redis-server (REDIS_ADDR
// names an existing one instead); PostgreSQL parts create a database of
// their own and drop it (internal/pgtest). Without either, those parts
// are skipped. SQLite parts keep their files in a temporary directory,
// removed at the end.
package httpbench
