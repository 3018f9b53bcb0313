// Package sqlitebench holds the benchmark of sqlitestore against the
// number of live records (BenchmarkKeyCount). It has no code outside its
// tests:
//
//	go test -run '^$' -bench KeyCount -benchtime 500x .
//
// Its files are in a temporary directory, removed at the end; it needs
// nothing else. sqlitestore beside its record floors, memstore and
// PostgreSQL over HTTP is BenchmarkHTTP's store=sqlite (package
// httpbench).
package sqlitebench
