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
// BenchmarkKeyCount reads the record floor's SELECT by primary key beside
// the store's replays on the same files: past 10^3 records both rise by
// the same microseconds, the pages that SQLite reads again from the file.
// A larger cache_size does not keep them: in WAL mode every commit of
// another connection empties a connection's cache. Nor does mmap_size
// (measured on 2026-12-02 with 1 GiB: 10^3 records cheaper, 10^6 dearer,
// each first touch of a page a fault), which would also turn an I/O error
// while reading into a signal that ends the process; the Store leaves it
// off.
//
// Its files are in a temporary directory, removed at the end; it needs
// nothing else. sqlitestore beside its record floors, memstore and
// PostgreSQL over HTTP is BenchmarkHTTP's store=sqlite (package
// httpbench).
package sqlitebench
