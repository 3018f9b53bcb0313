package sqlitestore_test

import (
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/sqlitestore"
)

// wantOpenError opens path with opts and expects an error that says want.
func wantOpenError(t *testing.T, path, want string, opts ...sqlitestore.Option) {
	t.Helper()
	s, err := sqlitestore.Open(path, opts...)
	if err == nil {
		s.Close()
		t.Fatalf("Open succeeded; want an error saying %q", want)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("Open: %v; want an error saying %q", err, want)
	}
	t.Logf("Open: %v", err)
}

// created returns the path of a file that a Store created and closed.
func created(t *testing.T) string {
	t.Helper()
	path := newPath(t)
	s, err := sqlitestore.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCheck: a Store's file passes Check, and Check after Close says so.
func TestCheck(t *testing.T) {
	s, err := sqlitestore.Open(newPath(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check: %v", err)
	}
	var mode string
	if err := s.DB().QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
		t.Fatalf("journal_mode %q, %v", mode, err)
	}
	s.Close()
	if err := s.Check(ctx); !errors.Is(err, idempotency.ErrStoreClosed) {
		t.Fatalf("Check after Close: %v, want ErrStoreClosed", err)
	}
}

// TestOpenQueryOnly: connections with PRAGMA query_only on are refused by
// name.
func TestOpenQueryOnly(t *testing.T) {
	wantOpenError(t, created(t), "query-only", sqlitestore.WithDSNParams("_pragma=query_only(1)"))
}

// TestOpenReadOnlyFile: a file that cannot be written is refused, saying
// why. As an unprivileged user the test makes the file and its -wal and
// -shm files read-only (chmod 0444); root ignores file modes, so as root it
// opens the file with mode=ro in its URI, as a read-only mount would.
func TestOpenReadOnlyFile(t *testing.T) {
	path := created(t)
	if os.Geteuid() == 0 {
		t.Log("running as root, which ignores file modes: simulating with mode=ro")
		wantOpenError(t, path, "cannot be written", sqlitestore.WithDSNParams("mode=ro"))
		return
	}
	for _, name := range []string{path, path + "-wal", path + "-shm"} {
		if err := os.Chmod(name, 0o444); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { os.Chmod(path, 0o644) })
	wantOpenError(t, path, "read-only")
}

// TestOpenReadOnlyDirectory: a file in a directory where SQLite cannot
// create the -wal and -shm files is refused, naming the directory. Root
// ignores file modes, so the test skips as root.
func TestOpenReadOnlyDirectory(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("running as root, which ignores the directory's mode")
	}
	path := created(t)
	dir := filepath.Dir(path)
	if err := os.Chmod(dir, 0o555); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(dir, 0o755) })
	wantOpenError(t, path, "directory "+dir+" is not writable")
}

// TestOpenNotWAL: a journal that is not in WAL mode is refused by name.
// The test sets another journal mode after the Store's own pragma, as a
// filesystem without shared memory leaves it.
func TestOpenNotWAL(t *testing.T) {
	wantOpenError(t, newPath(t), "not WAL", sqlitestore.WithDSNParams("_journal_mode=DELETE"))
}

// TestOpenOtherTable: a table of the Store's name with other columns is
// refused, naming both sets of columns.
func TestOpenOtherTable(t *testing.T) {
	path := newPath(t)
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE idempotency_records (id INTEGER PRIMARY KEY, name TEXT)`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	wantOpenError(t, path, "another table of that name")
	// Another name is free.
	s := open(t, path, sqlitestore.WithTable("idem"))
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestWithTablePanics: a bad table name is a programming error.
func TestWithTablePanics(t *testing.T) {
	for _, name := range []string{"", "1abc", `a"b`, "a.b", "sqlite_master", strings.Repeat("x", 65)} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("WithTable(%q) did not panic", name)
				}
			}()
			sqlitestore.WithTable(name)
		}()
	}
}
