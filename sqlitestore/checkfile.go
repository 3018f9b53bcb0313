package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"strings"
	"time"

	sqlite3 "modernc.org/sqlite/lib"

	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/servercheck/report"
)

// CheckOption configures CheckFile.
type CheckOption func(*checkConfig)

type checkConfig struct {
	purgeLag time.Duration
	// dsnParams are extra query parameters of the check's connection (tests
	// simulate a read-only file with them).
	dsnParams string
}

// WithPurgeLag sets how long a row may stay past its expiry before
// CheckFile's purge item warns that the purge is not running. It panics
// when d is negative.
//
// Default: 1h.
func WithPurgeLag(d time.Duration) CheckOption {
	if d < 0 {
		panic(fmt.Sprintf("sqlitestore: WithPurgeLag: %v is negative", d))
	}
	return func(c *checkConfig) { c.purgeLag = d }
}

// CheckFile judges whether the SQLite file at path, and its table named
// table (DefaultTable, or the name given to WithTable), keep sqlitestore's
// records safely, as package servercheck judges a Redis or PostgreSQL
// server: one report.Finding per item, in this order, with its
// verdict.
//
//   - file: it exists and is a regular file holding an SQLite database
//     (OK, with its size and mode), else Fail. CheckFile never creates a
//     missing file; it opens the file read-write without creating it.
//   - sqlite: the version of SQLite in this build (Info).
//   - journal_mode: WAL (OK), else Fail. The mode is stored in the file:
//     Open switches a file to WAL, and refuses one it cannot switch.
//   - writable: PRAGMA query_only is off and a write, rolled back,
//     succeeds (OK); Fail when the file, its -wal or -shm file or the
//     connection is read-only, saying which; Warn when another connection
//     held the write lock for longer than the check's busy timeout (5s),
//     so writing could not be tried.
//   - directory: a file can be created in the file's directory, where
//     SQLite creates the -wal and -shm files (OK), else Fail.
//   - synchronous and busy_timeout: Info. They are settings of each
//     connection, not of the file: every connection Open makes has
//     synchronous=FULL (Open and Store.Check refuse one where it is not)
//     and the busy timeout of WithBusyTimeout.
//   - table: it exists (OK, else Fail); then columns (schema.sql's, with
//     their types, NOT NULL and primary key: OK, else Fail),
//     expires-at-index (an index whose first column is expires_at: OK,
//     else Warn: every purge batch scans the table) and purge (the oldest
//     row past its expiry: Warn when it expired longer ago than
//     WithPurgeLag allows).
//   - outbox: the messages of the outbox table (DefaultOutboxTable) by
//     state, and how long the earliest due one has waited (Info; its
//     absence too: Open creates the table).
//   - quick_check: PRAGMA quick_check says ok (OK), else Fail with what
//     it found. It reads the whole file. A file SQLite finds corrupt
//     before (reading the table) gets this Fail there, and the items
//     after it are not checked.
//   - size: the pages, the free pages and the -wal file's size (Info).
//
// It writes nothing to the database: its write check is rolled back, as
// Store.Check's is. Like any connection to a file in WAL mode, its own
// creates the -wal and -shm files when they are missing, and, when it is
// the last connection to the file to close, moves what the -wal file
// holds into the database (a checkpoint); the directory check creates an
// empty file in the directory and removes it. It runs beside the
// application's Stores: its only write lock is the write check's, for a
// moment.
//
// It returns an error, with no Report, when table is not a table name
// (see WithTable), when path is empty, or when a query fails for another
// reason than those above (ctx ending, an I/O error). It panics when an
// option is nil.
func CheckFile(ctx context.Context, path, table string, opts ...CheckOption) (report.Report, error) {
	cfg := checkConfig{purgeLag: time.Hour}
	for _, o := range opts {
		if o == nil {
			panic("sqlitestore: CheckFile: nil CheckOption")
		}
		o(&cfg)
	}
	if path == "" {
		return report.Report{}, errors.New("sqlitestore: check: empty path")
	}
	t, err := parseTable(table)
	if err != nil {
		return report.Report{}, err
	}
	c := &fileCheck{path: path, table: t, cfg: cfg}
	if err := c.run(ctx); err != nil {
		return report.Report{}, fmt.Errorf("sqlitestore: check %s: %w", path, err)
	}
	return report.Report{Findings: c.findings}, nil
}

// fileCheck gathers the findings of one CheckFile.
type fileCheck struct {
	path     string
	table    table
	cfg      checkConfig
	findings []report.Finding
}

func (c *fileCheck) add(item string, v report.Verdict, value, detail string) {
	c.findings = append(c.findings, report.Finding{Item: item, Verdict: v, Value: value, Detail: detail})
}

// checkDSN is the URI of the check's connection: read-write without
// creating the file, the Store's busy timeout and BEGIN IMMEDIATE, and no
// journal_mode, which Open's connections set and the check reads.
func checkDSN(path string, cfg checkConfig) string {
	q := url.Values{"mode": {"rw"}, "_txlock": {"immediate"}}
	q.Set("_pragma", fmt.Sprintf("busy_timeout(%d)", defaultConfig().busyTimeout.Milliseconds()))
	return strings.TrimSuffix(fileURI(path)+"?"+q.Encode()+"&"+cfg.dsnParams, "&")
}

func (c *fileCheck) run(ctx context.Context) error {
	fi, err := os.Stat(c.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		c.add("file", report.Fail, c.path+" missing",
			"there is no such file: Open creates it, and the check does not; is this the path the application opens?")
		return nil
	case err != nil:
		c.add("file", report.Fail, c.path, err.Error())
		return nil
	case !fi.Mode().IsRegular():
		c.add("file", report.Fail, fmt.Sprintf("%s (mode %v)", c.path, fi.Mode()),
			"not a regular file: the path must name the database file itself")
		return nil
	}

	db, err := sql.Open("sqlite", checkDSN(c.path, c.cfg))
	if err != nil {
		return err
	}
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		return c.opening(fi, err)
	}
	defer conn.Close()
	// The first read of the file: its header.
	mode, err := pragma(ctx, conn, "journal_mode")
	if err != nil {
		return c.opening(fi, err)
	}
	c.addFile(fi)
	var version string
	if err := conn.QueryRowContext(ctx, "SELECT sqlite_version()").Scan(&version); err != nil {
		return err
	}
	c.add("sqlite", report.Info, "SQLite "+version,
		"the SQLite of modernc.org/sqlite in this build; the application reads the file with the SQLite of its own build")
	if isWAL(mode) {
		c.add("journal_mode", report.OK, mode, "readers (replays, duplicates in flight) run beside the writer")
	} else {
		c.add("journal_mode", report.Fail, mode,
			"not WAL: readers and the writer wait for each other, and a transactional handler holding the write lock stops every replay; Open switches a file to WAL (and refuses one it cannot switch, on a filesystem without shared memory), so no Store has opened this file since it was switched back; open it with the Store, or run PRAGMA journal_mode=WAL")
	}
	for _, step := range []func(context.Context, *sql.Conn) error{c.checkWrite, c.connectionSettings, c.checkTable, c.outbox, c.quickCheck, c.size} {
		if err := step(ctx, conn); err != nil {
			return c.unusable(err)
		}
	}
	return nil
}

func (c *fileCheck) addFile(fi os.FileInfo) {
	c.add("file", report.OK, fmt.Sprintf("%s (%d bytes, mode %v)", c.path, fi.Size(), fi.Mode().Perm()), "an SQLite database")
}

// opening judges an error of opening the file, or of reading its header:
// a file SQLite refuses to write to at all (in WAL mode, without its -shm
// file and a directory to create it in) is a database that cannot be
// written.
func (c *fileCheck) opening(fi os.FileInfo, err error) error {
	if code(err) == sqlite3.SQLITE_READONLY {
		c.addFile(fi)
	}
	return c.unusable(err)
}

// unusable turns an error that says the file cannot be used (it is not a
// database, is corrupt, cannot be opened or written) into a Fail, and
// returns nil; it returns other errors as they are.
func (c *fileCheck) unusable(err error) error {
	switch code(err) {
	case sqlite3.SQLITE_NOTADB:
		c.add("file", report.Fail, c.path+" is not an SQLite database",
			fmt.Sprintf("SQLite does not recognize the file's header (%v): is this the application's file? If it is, restore it from a backup", err))
	case sqlite3.SQLITE_CORRUPT:
		c.add("quick_check", report.Fail, "corrupt",
			fmt.Sprintf("SQLite found the file corrupt (%v): the store cannot read what it lost; restore the file from a backup", err))
	case sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM:
		c.add("file", report.Fail, c.path+" cannot be opened", fmt.Sprintf("%v: %s", err, readOnlyCause(c.path)))
	case sqlite3.SQLITE_READONLY:
		c.add("writable", report.Fail, "no", fmt.Sprintf("the database cannot be written: %s (%v)", readOnlyCause(c.path), err))
	default:
		return err
	}
	return nil
}

// checkWrite judges the items writable and directory.
func (c *fileCheck) checkWrite(ctx context.Context, conn *sql.Conn) error {
	err := checkWrite(ctx, conn, c.path)
	switch {
	case err == nil:
		c.add("writable", report.OK, "yes", "a write, rolled back, succeeded")
	case code(err) == sqlite3.SQLITE_BUSY:
		c.add("writable", report.Warn, "not checked",
			"another connection held the write lock for longer than the check's busy timeout (a long transactional handler, or a stuck process): run the check again")
	case code(err) == sqlite3.SQLITE_CORRUPT, code(err) == sqlite3.SQLITE_NOTADB:
		return err
	default:
		c.add("writable", report.Fail, "no", err.Error())
	}
	if err := checkDir(c.path); err != nil {
		c.add("directory", report.Fail, "not writable", err.Error())
	} else {
		c.add("directory", report.OK, "writable", "SQLite can create the -wal and -shm files there")
	}
	return nil
}

// connectionSettings explains synchronous and busy_timeout, which each
// connection sets for itself.
func (c *fileCheck) connectionSettings(context.Context, *sql.Conn) error {
	c.add("synchronous", report.Info, "FULL on the Store's connections",
		"a setting of each connection, not stored in the file: Open sets FULL on every connection (Store.DB's too), with which a commit in WAL mode is synced before it is acknowledged and survives a power loss, and refuses a connection where it is not FULL; another program's connection chooses its own (NORMAL can lose its last commits on a power loss, OFF can corrupt the file)")
	c.add("busy_timeout", report.Info, fmt.Sprintf("%v on the Store's connections, or WithBusyTimeout's", defaultConfig().busyTimeout),
		"a setting of each connection, not stored in the file: how long a connection waits for another process's write lock before SQLITE_BUSY (a Store's own writers take turns in the Store)")
	return nil
}

// checkTable judges the table, its columns, its index on expires_at and
// the purge.
func (c *fileCheck) checkTable(ctx context.Context, conn *sql.Conn) error {
	have, err := readColumns(ctx, conn, c.table)
	if err != nil {
		return err
	}
	if len(have) == 0 {
		c.add("table", report.Fail, c.table.name+" missing",
			"there is no such table: Open creates it (or run the SQL of Schema in your migrations); is this the application's file, and its table (WithTable)?")
		return nil
	}
	c.add("table", report.OK, c.table.name, "exists")
	if !sameColumns(have) {
		c.add("columns", report.Fail, joinColumns(have),
			fmt.Sprintf("not sqlitestore's columns (%s): it is another table of that name, and Open refuses it", joinColumns(columns)))
		return nil
	}
	c.add("columns", report.OK, fmt.Sprintf("%d columns", len(columns)), "as schema.sql creates them")

	var index string
	err = conn.QueryRowContext(ctx, `SELECT il.name FROM pragma_index_list(?1) AS il, pragma_index_info(il.name) AS ii
WHERE ii.seqno = 0 AND ii.name = 'expires_at' LIMIT 1`, c.table.name).Scan(&index)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		c.add("expires-at-index", report.Warn, "missing",
			"without an index on expires_at every purge batch scans the whole table, holding the write lock; Open creates it (see Schema)")
	case err != nil:
		return err
	default:
		c.add("expires-at-index", report.OK, index, "the purge walks it from the oldest entry: a batch costs the rows it deletes")
	}

	now := time.Now()
	var oldest sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT min(expires_at) FROM "+c.table.quoted+" WHERE expires_at <= ?", now.UnixMicro()).Scan(&oldest); err != nil {
		return err
	}
	age := now.Sub(time.UnixMicro(oldest.Int64)).Round(time.Second)
	switch {
	case !oldest.Valid:
		c.add("purge", report.OK, "no row past its expiry", "expired rows are being deleted")
	case age > c.cfg.purgeLag:
		c.add("purge", report.Warn, fmt.Sprintf("a row expired %v ago is still there", age),
			"expired rows are absent to requests but take space until purged: run the purge (WithPurgeInterval on one Store, or a job calling Store.Purge until it returns a short batch)")
	default:
		c.add("purge", report.OK, fmt.Sprintf("the oldest row past its expiry expired %v ago", age),
			fmt.Sprintf("within the purge lag of %v", c.cfg.purgeLag))
	}
	return nil
}

// outbox reports the outbox's messages by state, read by package
// lifecycle's status query.
func (c *fileCheck) outbox(ctx context.Context, conn *sql.Conn) error {
	have, err := readColumns(ctx, conn, mustTable(DefaultOutboxTable))
	if err != nil {
		return err
	}
	if len(have) == 0 {
		c.add("outbox", report.Info, DefaultOutboxTable+" missing", "the next Open creates it")
		return nil
	}
	t, err := lifecycle.New(DefaultOutboxTable, lifecycle.SQLite)
	if err != nil {
		return err
	}
	st, err := t.Status(ctx, lifecycle.SQL(conn, lifecycle.SQLite), 1)
	if err != nil {
		return err
	}
	var counts []string
	for _, state := range lifecycle.States() {
		if n := st.Counts[state]; n > 0 {
			counts = append(counts, fmt.Sprintf("%d %s", n, state))
		}
	}
	value := fmt.Sprintf("%d messages", st.Total)
	if len(counts) > 0 {
		value += ": " + strings.Join(counts, ", ")
	}
	detail := "no message is due"
	if st.Oldest != nil {
		detail = fmt.Sprintf("the earliest due message (%s) has waited %v for a relay (Store.Relay)", st.Oldest.ID, st.Now.Sub(st.Oldest.DueAt).Round(time.Millisecond))
	}
	c.add("outbox", report.Info, value, detail)
	return nil
}

// quickCheck runs PRAGMA quick_check, which reads every page.
func (c *fileCheck) quickCheck(ctx context.Context, conn *sql.Conn) error {
	rows, err := conn.QueryContext(ctx, "PRAGMA quick_check(20)")
	if err != nil {
		return err
	}
	defer rows.Close()
	// A row is "ok", or problems one a line, the first row's after a
	// line naming the database.
	var found []string
	for rows.Next() {
		var lines string
		if err := rows.Scan(&lines); err != nil {
			return err
		}
		for line := range strings.Lines(lines) {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "***") {
				found = append(found, line)
			}
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	switch {
	case len(found) == 1 && found[0] == "ok":
		c.add("quick_check", report.OK, "ok", "every page of the file reads back as SQLite wrote it")
	case len(found) == 1:
		c.add("quick_check", report.Fail, found[0], "the file is corrupt: restore it from a backup")
	default:
		c.add("quick_check", report.Fail, fmt.Sprintf("%s (and %d more)", found[0], len(found)-1),
			"the file is corrupt: restore it from a backup; quick_check found: "+strings.Join(found, "; "))
	}
	return nil
}

// size reports the file's pages and its -wal file.
func (c *fileCheck) size(ctx context.Context, conn *sql.Conn) error {
	var pages, pageSize, free int64
	if err := conn.QueryRowContext(ctx, "SELECT p.page_count, s.page_size, f.freelist_count FROM pragma_page_count() AS p, pragma_page_size() AS s, pragma_freelist_count() AS f").Scan(&pages, &pageSize, &free); err != nil {
		return err
	}
	wal := "no -wal file"
	if fi, err := os.Stat(c.path + "-wal"); err == nil {
		wal = fmt.Sprintf("-wal %d bytes", fi.Size())
	}
	c.add("size", report.Info, fmt.Sprintf("%d pages of %d bytes (%d bytes), %d free; %s", pages, pageSize, pages*pageSize, free, wal),
		"free pages are reused by later writes (VACUUM gives them back to the filesystem); the -wal file holds the commits not yet moved into the database, and is emptied by checkpoints")
	return nil
}
