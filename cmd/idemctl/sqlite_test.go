package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/servercheck"
	"github.com/go-idempotency/idempotency/sqlitestore"
)

// sqliteFixture returns the path of an SQLite file in a directory of the
// test's, which a Store created and closed.
func sqliteFixture(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "app.db")
	s, err := sqlitestore.Open(path)
	if err == nil {
		err = s.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// sqliteExec runs statements on path through a connection with none of the
// Store's settings.
func sqliteExec(t *testing.T, path string, statements ...string) {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range statements {
		if _, err := db.ExecContext(context.Background(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// TestSQLiteCheck: a Store's file is safe, by -sqlite and by SQLITE_PATH,
// and -json says so item by item.
func TestSQLiteCheck(t *testing.T) {
	path := sqliteFixture(t)
	r := idemctl(t, nil, "check", "-sqlite", path).want(t, exitOK)
	r.lines(t, [][]string{{"OK", "file", path}, {"INFO", "sqlite", "SQLite 3."}, {"OK", "journal_mode", "wal"},
		{"OK", "writable", "yes"}, {"OK", "directory", "writable"}, {"INFO", "synchronous", "FULL"}, {"INFO", "busy_timeout", "5s"},
		{"OK", "table", "idempotency_records"}, {"OK", "columns", "13 columns"},
		{"OK", "expires-at-index", "idempotency_records_expires_at_idx"}, {"OK", "purge", "no row past its expiry"},
		{"OK", "quick_check", "ok"}, {"INFO", "size"}})
	r.contains(t, "sqlite "+path+", table idempotency_records\n", "safe: 0 FAIL, 0 WARN, 9 OK, 5 INFO")
	if r.stderr != "" {
		t.Errorf("stderr: %s", r.stderr)
	}
	idemctl(t, map[string]string{"SQLITE_PATH": path}, "check", "-strict").want(t, exitOK).contains(t, "sqlite "+path)
	idemctl(t, nil, "check", "-sqlite", path, "-v").want(t, exitOK).contains(t, "not stored in the file")

	var out struct {
		Store    string                `json:"store"`
		Verdict  servercheck.Verdict   `json:"verdict"`
		Findings []servercheck.Finding `json:"findings"`
	}
	idemctl(t, nil, "check", "-sqlite", path, "-json").want(t, exitOK).decode(t, &out)
	if out.Verdict != servercheck.OK || out.Store != "sqlite "+path+", table idempotency_records" || len(out.Findings) != 14 {
		t.Errorf("check -json: %+v", out)
	}
	if i := slices.IndexFunc(out.Findings, func(f servercheck.Finding) bool { return f.Item == "journal_mode" }); i < 0 ||
		out.Findings[i].Verdict != servercheck.OK || out.Findings[i].Value != "wal" || out.Findings[i].Detail == "" {
		t.Errorf("check -json: no OK journal_mode finding of value wal in %+v", out.Findings)
	}
}

// TestSQLiteCheckUnsafe: what makes a file unsafe fails the check (exit
// status 1, UNSAFE, the reason under the line); a purge that lags warns,
// which fails only with -strict.
func TestSQLiteCheckUnsafe(t *testing.T) {
	t.Run("rollback journal", func(t *testing.T) {
		path := sqliteFixture(t)
		sqliteExec(t, path, "PRAGMA journal_mode=DELETE")
		r := idemctl(t, nil, "check", "-sqlite", path).want(t, exitFailure)
		r.lines(t, [][]string{{"FAIL", "journal_mode", "delete"}, {"OK", "quick_check", "ok"}}).
			contains(t, "not WAL: readers and the writer wait for each other", "UNSAFE: 1 FAIL, 0 WARN")
	})
	t.Run("missing file", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "nope.db")
		r := idemctl(t, nil, "check", "-sqlite", path).want(t, exitFailure)
		r.lines(t, [][]string{{"FAIL", "file", path + " missing"}}).contains(t, "the check does not", "UNSAFE: 1 FAIL, 0 WARN, 0 OK, 0 INFO")
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Errorf("after the check: %v, want no file", err)
		}
	})
	t.Run("missing table", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "app.db")
		sqliteExec(t, path, "PRAGMA journal_mode=WAL", "CREATE TABLE payments (id INTEGER PRIMARY KEY)")
		idemctl(t, nil, "check", "-sqlite", path).want(t, exitFailure).
			lines(t, [][]string{{"FAIL", "table", "idempotency_records missing"}, {"OK", "journal_mode", "wal"}})
		// -table names another table, which is judged as sqlitestore's.
		idemctl(t, nil, "check", "-sqlite", path, "-table", "payments").want(t, exitFailure).
			lines(t, [][]string{{"OK", "table", "payments"}, {"FAIL", "columns", "id INTEGER PRIMARY KEY"}})
		idemctl(t, nil, "check", "-sqlite", path, "-table", "billing.idem").want(t, exitFailure).contains(t, `table name "billing.idem"`)
	})
	t.Run("corrupt file", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "app.db")
		s, err := sqlitestore.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		body := jsonResponse([]byte(strings.Repeat("x", 300)))
		for i := range 100 {
			complete(t, s, "", fmt.Sprintf("key-%d", i), body, time.Hour)
		}
		s.Close()
		// Garbage over the middle half of every page but the first (the
		// header and the schema): the pages of the table and its indexes.
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		const page = 4096
		if len(data) < 8*page {
			t.Fatalf("the file has %d bytes, want 8 pages or more", len(data))
		}
		for off := page; off+page <= len(data); off += page {
			copy(data[off+page/4:off+page*3/4], strings.Repeat("\xde\xad\xbe\xef", page/8))
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		r := idemctl(t, nil, "check", "-sqlite", path).want(t, exitFailure)
		r.lines(t, [][]string{{"FAIL", "quick_check"}}).contains(t, "restore it from a backup", "UNSAFE")
	})
	t.Run("read-only file", func(t *testing.T) {
		if os.Geteuid() == 0 {
			t.Skip("running as root, which ignores file modes (sqlitestore's tests simulate it with mode=ro)")
		}
		path := sqliteFixture(t)
		for _, name := range []string{path, path + "-wal", path + "-shm"} {
			if err := os.Chmod(name, 0o444); err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() { os.Chmod(path, 0o644) })
		idemctl(t, nil, "check", "-sqlite", path).want(t, exitFailure).
			lines(t, [][]string{{"FAIL", "writable", "no"}}).contains(t, "read-only")
	})
	t.Run("purge lags", func(t *testing.T) {
		path := sqliteFixture(t)
		old := time.Now().Add(-3 * time.Hour).UnixMicro()
		sqliteExec(t, path, `INSERT INTO idempotency_records (key, state, token, fingerprint, epoch, lease_until, ttl_until, expires_at, updated_at)
			VALUES ('k', 'in_progress', 't', x'', 1, `+itoa(old)+`, `+itoa(old)+`, `+itoa(old)+`, `+itoa(old)+`)`)
		idemctl(t, nil, "check", "-sqlite", path).want(t, exitOK).
			lines(t, [][]string{{"WARN", "purge", "a row expired 3h0m0s ago"}}).contains(t, "safe, with warnings: 0 FAIL, 1 WARN")
		idemctl(t, nil, "check", "-sqlite", path, "-strict").want(t, exitFailure)
		idemctl(t, nil, "check", "-sqlite", path, "-purge-lag", "4h").want(t, exitOK).lines(t, [][]string{{"OK", "purge"}})
	})
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestSQLiteStoreChoice: -sqlite and SQLITE_PATH are check's alone, and
// name one store among the others.
func TestSQLiteStoreChoice(t *testing.T) {
	path := sqliteFixture(t)
	idemctl(t, nil, "check", "-sqlite", path, "-redis", "127.0.0.1:1").want(t, exitUsage).contains(t, "both Redis and SQLite given")
	idemctl(t, nil, "check", "-sqlite", path, "-postgres", "postgres://x@127.0.0.1:1/x").want(t, exitUsage).contains(t, "both PostgreSQL and SQLite given")
	idemctl(t, map[string]string{"SQLITE_PATH": path, "DATABASE_URL": "postgres://x@127.0.0.1:1/x"}, "check").
		want(t, exitUsage).contains(t, "both DATABASE_URL and SQLITE_PATH are set: choose with -postgres or -sqlite")
	idemctl(t, map[string]string{"SQLITE_PATH": path, "DATABASE_URL": "postgres://x@127.0.0.1:1/x", "REDIS_ADDR": "127.0.0.1:1"}, "check").
		want(t, exitUsage).contains(t, "REDIS_URL (or REDIS_ADDR), DATABASE_URL and SQLITE_PATH are set: choose with -redis, -postgres or -sqlite")
	// A flag wins over the environment.
	idemctl(t, map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1:1/x"}, "check", "-sqlite", path).want(t, exitOK)
	idemctl(t, nil, "check").want(t, exitUsage).contains(t, "give -redis, -sentinel, -postgres or -sqlite")

	// The other commands read Redis and PostgreSQL only.
	sk := strings.Repeat("ab", 32)
	idemctl(t, nil, "inspect", "-sqlite", path, sk).want(t, exitUsage).contains(t, "flag provided but not defined: -sqlite")
	idemctl(t, map[string]string{"SQLITE_PATH": path}, "inspect", sk).want(t, exitUsage).contains(t, "check alone reads an SQLite file")
	// Their environment is read as before: SQLITE_PATH does not count.
	idemctl(t, map[string]string{"SQLITE_PATH": path, "REDIS_ADDR": "127.0.0.1:1"}, "inspect", "-timeout", "2s", sk).want(t, exitFailure)
}
