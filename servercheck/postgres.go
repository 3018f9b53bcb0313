package servercheck

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency/internal/pgname"
)

// Querier is what Postgres reads through: a *pgxpool.Pool, a *pgx.Conn or
// a pgx.Tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// PostgresOption configures Postgres.
type PostgresOption func(*pgConfig)

type pgConfig struct {
	purgeLag time.Duration
}

// WithPurgeLag sets how long a row may stay past its expiry before the
// purge item warns that the purge is not running. It panics when d is
// negative.
//
// Default: 1h.
func WithPurgeLag(d time.Duration) PostgresOption {
	if d < 0 {
		panic(fmt.Sprintf("servercheck: WithPurgeLag: %v is negative", d))
	}
	return func(c *pgConfig) { c.purgeLag = d }
}

// pgColumns are the columns of pgstore's table and their types.
var pgColumns = []struct{ name, typ string }{
	{"key", "text"}, {"state", "text"}, {"token", "text"}, {"fingerprint", "bytea"}, {"epoch", "bigint"},
	{"lease_until", "timestamp with time zone"}, {"ttl_until", "timestamp with time zone"},
	{"expires_at", "timestamp with time zone"}, {"watched", "boolean"}, {"status", "integer"},
	{"headers", "bytea"}, {"body", "bytea"}, {"body_omitted", "boolean"}, {"updated_at", "timestamp with time zone"},
}

// Postgres reads the settings of the PostgreSQL server db reaches and the
// schema of pgstore's table (a name, or schema.name, as pgstore.WithTable
// takes it: pgstore.DefaultTable by default) and judges whether they keep
// pgstore's records safely. It only reads. The items, and their verdicts:
//
//   - version: 12 or later (OK, else Fail: the schema needs a stored
//     generated column).
//   - recovery: a primary (OK) or a standby, which refuses every write
//     (Fail).
//   - table: it exists (OK, else Fail); then columns (every column of
//     pgstore.Schema, with its type), primary-key ((key)) and
//     acquire-function (the function the acquire statement calls): OK,
//     else Fail; expires-at-index: OK, or Warn without it (every purge
//     batch scans the table).
//   - fsync: on (OK, else Fail); full_page_writes: Warn when off.
//   - synchronous_commit: Warn when off, or local with synchronous
//     standbys; else OK.
//   - replication: no standbys streaming from this server (Info),
//     asynchronous standbys (Warn: a failover loses the last commits), or
//     synchronous ones (OK).
//   - idle_in_transaction_session_timeout: set (OK) or 0 (Warn), as this
//     connection's role sees it.
//   - autovacuum: Warn when off, for the server or for the table.
//   - purge: the oldest row past its expiry, Warn when it expired longer
//     ago than WithPurgeLag allows.
//   - clock: the server's clock against this host's (Info).
//
// It returns an error, with no Report, when a query fails or table is not
// such a name. It panics when db is nil.
func Postgres(ctx context.Context, db Querier, table string, opts ...PostgresOption) (Report, error) {
	if db == nil {
		panic("servercheck: Postgres: nil db")
	}
	cfg := pgConfig{purgeLag: time.Hour}
	for _, o := range opts {
		if o == nil {
			panic("servercheck: Postgres: nil PostgresOption")
		}
		o(&cfg)
	}
	t, err := pgname.ParseTable(table)
	if err != nil {
		return Report{}, fmt.Errorf("servercheck: table name %w", err)
	}
	c := &pgCheck{db: db, table: t, cfg: cfg}
	if err := c.run(ctx); err != nil {
		return Report{}, fmt.Errorf("servercheck: %w", err)
	}
	return Report{Findings: c.findings}, nil
}

// pgCheck gathers the findings of one Postgres check.
type pgCheck struct {
	db       Querier
	table    pgname.Table
	cfg      pgConfig
	findings []Finding
}

func (c *pgCheck) add(item string, v Verdict, value, detail string) {
	c.findings = append(c.findings, Finding{Item: item, Verdict: v, Value: value, Detail: detail})
}

// setting returns the value of the server setting name, as this
// connection's role sees it.
func (c *pgCheck) setting(ctx context.Context, name string) (string, error) {
	var v string
	err := c.db.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v)
	return v, err
}

// column returns the one text column of every row of query.
func (c *pgCheck) column(ctx context.Context, query string, args ...any) ([]string, error) {
	rows, err := c.db.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

func (c *pgCheck) run(ctx context.Context) error {
	var versionNum int
	var version string
	if err := c.db.QueryRow(ctx, "SELECT current_setting('server_version_num')::int, current_setting('server_version')").Scan(&versionNum, &version); err != nil {
		return err
	}
	if versionNum >= 120000 {
		c.add("version", OK, "PostgreSQL "+version, "12 or later: the schema's stored generated column works")
	} else {
		c.add("version", Fail, "PostgreSQL "+version, "pgstore needs PostgreSQL 12 or later (a stored generated column)")
	}

	var standby bool
	if err := c.db.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&standby); err != nil {
		return err
	}
	if standby {
		c.add("recovery", Fail, "standby", "this server is a standby: it refuses every write of the store; connect to the primary")
	} else {
		c.add("recovery", OK, "primary", "writes go here")
	}

	var exists bool
	if err := c.db.QueryRow(ctx, "SELECT to_regclass($1::text) IS NOT NULL", c.table.Quoted()).Scan(&exists); err != nil {
		return err
	}
	if !exists {
		c.add("table", Fail, c.table.String()+" missing",
			"the table does not exist (in this connection's search_path): run pgstore.Migrate, or the SQL of pgstore.Schema in your migrations")
	} else {
		c.add("table", OK, c.table.String(), "exists")
		if err := c.checkTable(ctx); err != nil {
			return err
		}
	}

	fsync, err := c.setting(ctx, "fsync")
	if err != nil {
		return err
	}
	if fsync == "on" {
		c.add("fsync", OK, "on", "commits reach the disk")
	} else {
		c.add("fsync", Fail, fsync, "a crash of the server can lose or corrupt committed records; turn fsync on")
	}
	if fpw, err := c.setting(ctx, "full_page_writes"); err == nil && fpw != "on" {
		c.add("full_page_writes", Warn, fpw, "a crash during a page write can corrupt the table; turn full_page_writes on")
	}

	syncCommit, err := c.setting(ctx, "synchronous_commit")
	if err != nil {
		return err
	}
	syncNames, err := c.setting(ctx, "synchronous_standby_names")
	if err != nil {
		return err
	}
	switch {
	case syncCommit == "off":
		c.add("synchronous_commit", Warn, "off",
			"a commit is acknowledged before it is on disk: a crash loses the last commits, completed records (and on transactional routes the handler's writes with them), and their keys run again; use on")
	case syncCommit == "local" && syncNames != "":
		c.add("synchronous_commit", Warn, "local",
			"commits do not wait for the synchronous standbys: a failover can lose the last ones; use on or remote_apply")
	default:
		c.add("synchronous_commit", OK, syncCommit, "a commit is on disk before it is acknowledged")
	}

	var standbys int
	if err := c.db.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication").Scan(&standbys); err != nil {
		return err
	}
	switch {
	case standbys == 0:
		c.add("replication", Info, "no standbys streaming from this server", "a failover, if any, is to a copy this server does not feed")
	case syncNames == "":
		c.add("replication", Warn, fmt.Sprintf("%d asynchronous standbys", standbys),
			"a failover to a standby loses the commits it had not received: records, and their keys run again; set synchronous_standby_names (with synchronous_commit on or remote_apply)")
	default:
		c.add("replication", OK, fmt.Sprintf("%d standbys, synchronous_standby_names %q", standbys, syncNames),
			"a commit is on a synchronous standby before it is acknowledged")
	}

	idle, err := c.setting(ctx, "idle_in_transaction_session_timeout")
	if err != nil {
		return err
	}
	if idle == "0" {
		c.add("idle_in_transaction_session_timeout", Warn, "0 (none)",
			"a transactional route's transaction abandoned by a frozen process keeps its row locks and connection forever; set it on the application's role (this is what this connection's role sees)")
	} else {
		c.add("idle_in_transaction_session_timeout", OK, idle, "abandoned transactions end")
	}

	av, err := c.setting(ctx, "autovacuum")
	if err != nil {
		return err
	}
	if av != "on" {
		c.add("autovacuum", Warn, av, "every request writes, updates and later deletes a row: without autovacuum the table bloats")
	}

	before := time.Now()
	var serverNow time.Time
	if err := c.db.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&serverNow); err != nil {
		return err
	}
	c.add("clock", Info, describeOffset(clockOffset(serverNow, before, time.Now())),
		"leases and TTLs are judged by the server's clock alone (clock_timestamp()); the application's clocks do not matter")
	return nil
}

// checkTable judges the columns, keys, indexes and purge of the table.
func (c *pgCheck) checkTable(ctx context.Context) error {
	rows, err := c.db.Query(ctx, `
SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = to_regclass($1::text) AND attnum > 0 AND NOT attisdropped`, c.table.Quoted())
	if err != nil {
		return err
	}
	have := map[string]string{}
	var name, typ string
	if _, err := pgx.ForEachRow(rows, []any{&name, &typ}, func() error {
		have[name] = typ
		return nil
	}); err != nil {
		return err
	}
	var wrong []string
	for _, col := range pgColumns {
		switch got, ok := have[col.name]; {
		case !ok:
			wrong = append(wrong, col.name+" missing")
		case got != col.typ:
			wrong = append(wrong, fmt.Sprintf("%s is %s, not %s", col.name, got, col.typ))
		}
	}
	if len(wrong) > 0 {
		c.add("columns", Fail, strings.Join(wrong, "; "), "the table is not pgstore's: compare it with pgstore.Schema")
	} else {
		c.add("columns", OK, fmt.Sprintf("%d columns", len(pgColumns)), "as pgstore.Schema creates them")
	}

	pk, err := c.column(ctx, `
SELECT a.attname::text FROM pg_index x JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = ANY (x.indkey)
WHERE x.indrelid = to_regclass($1::text) AND x.indisprimary`, c.table.Quoted())
	if err != nil {
		return err
	}
	if slices.Equal(pk, []string{"key"}) {
		c.add("primary-key", OK, "(key)", "one row per storage key: acquire's INSERT ... ON CONFLICT (key) needs it")
	} else {
		c.add("primary-key", Fail, fmt.Sprintf("(%s)", strings.Join(pk, ", ")),
			"the primary key must be (key): acquire's INSERT ... ON CONFLICT (key) needs it")
	}

	// The acquire statement calls <table>_acquire (pgstore.Schema creates
	// it beside the table) whenever a record must be made or changed.
	fn := c.table.AcquireFunction()
	var found bool
	if err := c.db.QueryRow(ctx, `SELECT to_regproc($1::text) IS NOT NULL`, fn).Scan(&found); err != nil {
		return err
	}
	if found {
		c.add("acquire-function", OK, fn, "acquire calls it when a record must be made or changed")
	} else {
		c.add("acquire-function", Fail, fn+" missing",
			"every new key fails without it: run pgstore.Migrate, or the SQL of pgstore.Schema in your migrations")
	}

	var index *string
	err = c.db.QueryRow(ctx, `
SELECT i.relname::text FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = x.indkey[0]
WHERE x.indrelid = to_regclass($1::text) AND a.attname = 'expires_at' AND x.indisvalid
LIMIT 1`, c.table.Quoted()).Scan(&index)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	if index != nil {
		c.add("expires-at-index", OK, *index, "the purge walks it from the oldest entry: a batch costs the rows it deletes")
	} else {
		c.add("expires-at-index", Warn, "missing",
			"without an index on expires_at every purge batch scans the whole table; create it (see pgstore.Schema)")
	}

	var reloptions []string
	if err := c.db.QueryRow(ctx, `SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = to_regclass($1::text)`,
		c.table.Quoted()).Scan(&reloptions); err != nil {
		return err
	}
	if slices.Contains(reloptions, "autovacuum_enabled=false") {
		c.add("autovacuum", Warn, "off for "+c.table.String(),
			"every request writes, updates and later deletes a row: without autovacuum the table bloats")
	}

	if _, ok := have["expires_at"]; !ok {
		c.add("purge", Info, "not checked", "the table has no expires_at column")
		return nil
	}
	var oldest *time.Time
	var now time.Time
	if err := c.db.QueryRow(ctx, `
SELECT (SELECT min(expires_at) FROM `+c.table.Quoted()+` WHERE expires_at <= n), n FROM (SELECT clock_timestamp() AS n) now`).Scan(&oldest, &now); err != nil {
		return err
	}
	switch {
	case oldest == nil:
		c.add("purge", OK, "no row past its expiry", "expired rows are being deleted")
	case now.Sub(*oldest) > c.cfg.purgeLag:
		c.add("purge", Warn, fmt.Sprintf("a row expired %s ago is still there", describeAge(now.Sub(*oldest))),
			"expired rows are absent to requests but take space until purged: run the purge (pgstore.WithPurgeInterval on an instance, or a job calling Store.Purge until it returns a short batch)")
	default:
		c.add("purge", OK, fmt.Sprintf("the oldest row past its expiry expired %s ago", describeAge(now.Sub(*oldest))),
			fmt.Sprintf("within the purge lag of %v", c.cfg.purgeLag))
	}
	return nil
}
