// Package sqlitebench holds the benchmarks of sqlitestore in process: its
// cost against the number of live records (BenchmarkKeyCount), and its
// calls beside its record floor, the same round trips done by hand on a
// file with the store's settings (BenchmarkFloor, the floor of package
// internal/sqlitefloor, which BenchmarkHTTP serves over HTTP). It has no
// code outside its tests:
//
//	go test -run '^$' -bench KeyCount -benchtime 500x .
//	go test -run '^$' -bench Floor -benchtime 1500x -count 6 .
//
// Its files are in a temporary directory, removed at the end; it needs
// nothing else. sqlitestore beside its record floors, memstore and
// PostgreSQL over HTTP is BenchmarkHTTP's store=sqlite (package
// httpbench).
package sqlitebench
