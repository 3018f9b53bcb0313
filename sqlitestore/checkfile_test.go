package sqlitestore_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/servercheck/report"
	"github.com/go-idempotency/idempotency/sqlitestore"
)

// checkFile runs CheckFile on path and the default table, failing the
// test on an error.
func checkFile(t *testing.T, path string, opts ...sqlitestore.CheckOption) report.Report {
	t.Helper()
	r, err := sqlitestore.CheckFile(ctx, path, sqlitestore.DefaultTable, opts...)
	if err != nil {
		t.Fatalf("CheckFile: %v", err)
	}
	for _, f := range r.Findings {
		t.Logf("%-5v %-16s %s", f.Verdict, f.Item, f.Value)
	}
	return r
}

// finding returns r's finding about item, failing the test when there is
// none.
func finding(t *testing.T, r report.Report, item string) report.Finding {
	t.Helper()
	i := slices.IndexFunc(r.Findings, func(f report.Finding) bool { return f.Item == item })
	if i < 0 {
		t.Fatalf("no finding about %s in %+v", item, r.Findings)
	}
	return r.Findings[i]
}

// wantFinding fails the test unless r's finding about item has verdict v
// and says each of says in its value or detail.
func wantFinding(t *testing.T, r report.Report, item string, v report.Verdict, says ...string) {
	t.Helper()
	f := finding(t, r, item)
	if f.Verdict != v {
		t.Errorf("%s: %v (%s: %s), want %v", item, f.Verdict, f.Value, f.Detail, v)
	}
	for _, s := range says {
		if !strings.Contains(f.Value+" "+f.Detail, s) {
			t.Errorf("%s says %q: %q, not %q", item, f.Value, f.Detail, s)
		}
	}
}

// rawDB opens path with no settings of the Store's, closed when the test
// ends.
func rawDB(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func exec(t *testing.T, db *sql.DB, query string, args ...any) {
	t.Helper()
	if _, err := db.ExecContext(ctx, query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// dirNames lists the names in path's directory.
func dirNames(t *testing.T, path string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// TestCheckFileSafe: the file of a Store that was closed passes every item,
// and the check leaves the file as it was, byte for byte, and nothing in
// the directory. It passes again while a Store has the file open and
// serves records.
func TestCheckFileSafe(t *testing.T) {
	path := created(t)
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	names := dirNames(t, path)
	r := checkFile(t, path)
	if r.Worst() != report.OK {
		t.Errorf("worst %v, want OK", r.Worst())
	}
	var items []string
	for _, f := range r.Findings {
		items = append(items, f.Item)
	}
	want := []string{"file", "sqlite", "journal_mode", "writable", "directory", "synchronous", "busy_timeout",
		"table", "columns", "expires-at-index", "purge", "outbox", "quick_check", "size"}
	if !slices.Equal(items, want) {
		t.Errorf("items %q, want %q", items, want)
	}
	wantFinding(t, r, "journal_mode", report.OK, "wal")
	wantFinding(t, r, "writable", report.OK, "rolled back")
	wantFinding(t, r, "columns", report.OK, "13 columns")
	wantFinding(t, r, "expires-at-index", report.OK, "idempotency_records_expires_at_idx")
	wantFinding(t, r, "purge", report.OK, "no row past its expiry")
	wantFinding(t, r, "quick_check", report.OK, "ok")
	wantFinding(t, r, "synchronous", report.Info, "not stored in the file")
	wantFinding(t, r, "outbox", report.Info, "0 messages")
	after, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Error("the check changed the file")
	}
	if got := dirNames(t, path); !slices.Equal(got, names) {
		t.Errorf("the directory held %q, and after the check %q", names, got)
	}

	// Beside a Store that serves records.
	s := open(t, path)
	for range 20 {
		acquire(t, s, req(newKey(), "t1", "fp", time.Minute, time.Hour), idempotency.Acquired)
	}
	r = checkFile(t, path)
	if r.Worst() != report.OK {
		t.Errorf("beside a Store: worst %v, want OK", r.Worst())
	}
	acquire(t, s, req(newKey(), "t1", "fp", time.Minute, time.Hour), idempotency.Acquired)
	var n int
	if err := s.DB().QueryRowContext(ctx, "SELECT count(*) FROM idempotency_records").Scan(&n); err != nil || n != 21 {
		t.Errorf("after the check the Store holds %d records (%v), want 21", n, err)
	}
}

// TestCheckFileMissing: a missing file is a Fail, and the check does not
// create it.
func TestCheckFileMissing(t *testing.T) {
	path := newPath(t)
	r := checkFile(t, path)
	wantFinding(t, r, "file", report.Fail, "missing", "does not")
	if len(r.Findings) != 1 {
		t.Errorf("%d findings, want only the file's", len(r.Findings))
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("after the check: %v, want no file", err)
	}
	if names := dirNames(t, path); len(names) != 0 {
		t.Errorf("the check left %q in the directory", names)
	}
	// A directory is not a database file.
	r = checkFile(t, filepath.Dir(path))
	wantFinding(t, r, "file", report.Fail, "not a regular file")
}

// TestCheckFileJournalNotWAL: a file switched back to the rollback
// journal is a Fail, and the check leaves it in that mode: the journal
// mode is stored in the file, and the check reads it without setting it.
func TestCheckFileJournalNotWAL(t *testing.T) {
	path := created(t)
	db := rawDB(t, path)
	var mode string
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode=DELETE").Scan(&mode); err != nil || mode != "delete" {
		t.Fatalf("journal_mode=DELETE: %q, %v", mode, err)
	}
	db.Close()
	r := checkFile(t, path)
	wantFinding(t, r, "journal_mode", report.Fail, "delete", "not WAL")
	if r.Worst() != report.Fail {
		t.Errorf("worst %v, want FAIL", r.Worst())
	}
	// The rest is judged all the same.
	wantFinding(t, r, "writable", report.OK)
	wantFinding(t, r, "quick_check", report.OK)
	if err := rawDB(t, path).QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil || mode != "delete" {
		t.Errorf("after the check the journal mode is %q (%v), want delete", mode, err)
	}
}

// TestCheckFileReadOnly: a file, or a directory, that cannot be written
// is a Fail saying which. As an unprivileged user the test takes away the
// write permission (chmod). Root ignores file modes: as root the file's
// case opens the check's connection with mode=ro in its URI, as a
// read-only mount would, and the directory's case skips.
func TestCheckFileReadOnly(t *testing.T) {
	for _, tc := range []struct {
		name  string
		chmod func(path string) []string // what loses the write permission
		says  func(path string) string
	}{
		{"file", func(path string) []string { return []string{path, path + "-wal", path + "-shm"} },
			func(path string) string { return "the file " + path + " is read-only (mode -r--r--r--)" }},
		{"directory", func(path string) []string { return []string{filepath.Dir(path)} },
			func(path string) string { return "directory " + filepath.Dir(path) + " is not writable" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := created(t)
			if os.Geteuid() == 0 {
				if tc.name == "directory" {
					t.Skip("running as root, which ignores the directory's mode")
				}
				t.Log("running as root, which ignores file modes: simulating with mode=ro")
				r := checkFile(t, path, sqlitestore.WithCheckDSNParams("mode=ro"))
				wantFinding(t, r, "writable", report.Fail, "cannot be written", "connection is read-only")
				return
			}
			for _, name := range tc.chmod(path) {
				fi, err := os.Stat(name)
				if os.IsNotExist(err) {
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(name, fi.Mode().Perm()&^0o222); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { os.Chmod(name, fi.Mode().Perm()) })
			}
			r := checkFile(t, path)
			if r.Worst() != report.Fail || !strings.Contains(strings.Join(details(r), "\n"), tc.says(path)) {
				t.Errorf("worst %v, findings %q: want a FAIL saying %q", r.Worst(), details(r), tc.says(path))
			}
		})
	}
}

func details(r report.Report) []string {
	var out []string
	for _, f := range r.Findings {
		out = append(out, f.Verdict.String()+" "+f.Item+": "+f.Value+": "+f.Detail)
	}
	return out
}

// TestCheckFileTable: a file without the table, a table of that name with
// other columns and a table without its index on expires_at.
func TestCheckFileTable(t *testing.T) {
	t.Run("missing", func(t *testing.T) {
		path := newPath(t)
		db := rawDB(t, path)
		exec(t, db, "PRAGMA journal_mode=WAL")
		exec(t, db, "CREATE TABLE payments (id INTEGER PRIMARY KEY)")
		db.Close()
		r := checkFile(t, path)
		wantFinding(t, r, "table", report.Fail, "idempotency_records missing", "Open creates it")
		wantFinding(t, r, "journal_mode", report.OK)
		if i := slices.IndexFunc(r.Findings, func(f report.Finding) bool { return f.Item == "columns" || f.Item == "purge" }); i >= 0 {
			t.Errorf("a missing table's %s was judged", r.Findings[i].Item)
		}
		// Another table name is checked as given.
		r, err := sqlitestore.CheckFile(ctx, path, "payments")
		if err != nil {
			t.Fatal(err)
		}
		wantFinding(t, r, "columns", report.Fail, "id INTEGER PRIMARY KEY", "another table")
	})
	t.Run("no index", func(t *testing.T) {
		path := created(t)
		db := rawDB(t, path)
		exec(t, db, "DROP INDEX idempotency_records_expires_at_idx")
		db.Close()
		r := checkFile(t, path)
		wantFinding(t, r, "expires-at-index", report.Warn, "missing")
		if r.Worst() != report.Warn {
			t.Errorf("worst %v, want WARN", r.Worst())
		}
	})
}

// TestCheckFilePurge: a row that expired longer ago than the purge lag
// is a Warn; within it, OK.
func TestCheckFilePurge(t *testing.T) {
	path := created(t)
	db := rawDB(t, path)
	expired := time.Now().Add(-2 * time.Hour).UnixMicro()
	exec(t, db, `INSERT INTO idempotency_records (key, state, token, fingerprint, epoch, lease_until, ttl_until, expires_at, updated_at)
		VALUES ('k', 'in_progress', 't', x'', 1, ?1, ?1, ?1, ?1)`, expired)
	db.Close()
	wantFinding(t, checkFile(t, path), "purge", report.Warn, "a row expired 2h0m0s ago")
	wantFinding(t, checkFile(t, path, sqlitestore.WithPurgeLag(3*time.Hour)), "purge", report.OK, "within the purge lag of 3h0m0s")
}

// TestCheckFileCorrupt: garbage written into the middle of the file's
// pages is found by quick_check; a file that is not a database at all is
// named so.
func TestCheckFileCorrupt(t *testing.T) {
	path := newPath(t)
	s := open(t, path)
	body := strings.Repeat("x", 300)
	for range 200 {
		key := newKey()
		acquire(t, s, req(key, "t", "fp", time.Minute, time.Hour), idempotency.Acquired)
		if err := s.Complete(ctx, key, "t", &idempotency.Response{Status: 201, Body: []byte(body)}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := f.Stat()
	const page = 4096
	if fi.Size() < 8*page {
		t.Fatalf("the file has %d bytes, want 8 pages or more", fi.Size())
	}
	// Random bytes over the middle half of every page but the first (the
	// header and the schema): the table's pages and its indexes'.
	garbage := make([]byte, page/2)
	for off := int64(page); off+page <= fi.Size(); off += page {
		rand.Read(garbage)
		if _, err := f.WriteAt(garbage, off+page/4); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	r := checkFile(t, path)
	wantFinding(t, r, "quick_check", report.Fail)
	if r.Worst() != report.Fail {
		t.Errorf("worst %v, want FAIL", r.Worst())
	}

	junk := filepath.Join(t.TempDir(), "notes.txt")
	if err := os.WriteFile(junk, bytes.Repeat([]byte("not a database\n"), 100), 0o644); err != nil {
		t.Fatal(err)
	}
	r = checkFile(t, junk)
	wantFinding(t, r, "file", report.Fail, "not an SQLite database")
	if len(r.Findings) != 1 {
		t.Errorf("%d findings, want the file's alone: %q", len(r.Findings), details(r))
	}
}

// TestCheckFileErrors: what is not a check of a file is an error.
func TestCheckFileErrors(t *testing.T) {
	if _, err := sqlitestore.CheckFile(ctx, "", sqlitestore.DefaultTable); err == nil || !strings.Contains(err.Error(), "empty path") {
		t.Errorf("empty path: %v", err)
	}
	if _, err := sqlitestore.CheckFile(ctx, created(t), "a.b"); err == nil || !strings.Contains(err.Error(), "table name") {
		t.Errorf("table a.b: %v", err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("WithPurgeLag(-1s) did not panic")
			}
		}()
		sqlitestore.WithPurgeLag(-time.Second)
	}()
}

// TestOpenSynchronousNotFull: a connection whose synchronous is not FULL
// is refused: synchronous is a setting of each connection, and Open judges
// its own. The test sets NORMAL after the Store's own pragma.
func TestOpenSynchronousNotFull(t *testing.T) {
	wantOpenError(t, newPath(t), "not FULL", sqlitestore.WithDSNParams("_pragma=synchronous(NORMAL)"))
}

// TestCheckFileOutbox: the check counts the outbox's messages by state and
// says how long the earliest due one has waited, and says when the file
// has no outbox table yet.
func TestCheckFileOutbox(t *testing.T) {
	path := newPath(t)
	s := open(t, path)
	runner := idempotency.NewRunner(s, idempotency.WithTransaction(true))
	for i := range 3 {
		if _, err := idempotency.Do(ctx, runner, idempotency.Call{Name: "pay", Key: fmt.Sprint("k", i)}, func(ctx context.Context) ([]string, error) {
			return outbox.Enqueue(ctx, outbox.Message{Topic: "t", Payload: []byte("x")})
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	r := checkFile(t, path)
	wantFinding(t, r, "outbox", report.Info, "3 messages: 3 ready")
	if f := finding(t, r, "outbox"); !strings.Contains(f.Detail, "has waited") {
		t.Errorf("outbox detail %q, want the earliest due message's wait", f.Detail)
	}

	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`DROP TABLE ` + sqlitestore.DefaultOutboxTable); err != nil {
		t.Fatal(err)
	}
	wantFinding(t, checkFile(t, path), "outbox", report.Info, "idempotency_outbox missing")
}
