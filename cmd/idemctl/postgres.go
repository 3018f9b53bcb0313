package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/go-idempotency/idempotency/internal/wire"
	"github.com/go-idempotency/idempotency/redisstore"
)

// pgBackend works on pgstore's records: one row per record (see
// pgstore/README.md and schema.sql).
type pgBackend struct {
	conn  *pgx.Conn
	table pgTable
	where string
}

func (b *pgBackend) describe() string { return fmt.Sprintf("%s, table %s", b.where, b.table.name) }

func (b *pgBackend) location(key string) string {
	return fmt.Sprintf("%s row %s", b.table.name, key)
}

func (b *pgBackend) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b.conn.Close(ctx)
}

// sql returns query with {table} replaced by the quoted table name.
func (b *pgBackend) sql(query string) string {
	return strings.ReplaceAll(query, "{table}", b.table.quoted)
}

// pgRow is a record's row as the inspect query reads it.
type pgRow struct {
	state       string
	token       string
	fingerprint []byte
	epoch       int64
	leaseUntil  time.Time
	ttlUntil    time.Time
	expiresAt   *time.Time
	watched     bool
	status      *int32
	headers     []byte
	body        []byte // the first bytes
	bodyLen     *int32
	omitted     *bool
	updated     time.Time
	now         time.Time
}

// selectRow reads a row; $1 is the key, $2 the number of body bytes.
const selectRow = `
SELECT state, token, fingerprint, epoch, lease_until, ttl_until, expires_at, watched, status, headers,
	substring(body FROM 1 FOR $2::integer), length(body), body_omitted, updated_at, clock_timestamp()
FROM {table} WHERE key = $1::text`

func (b *pgBackend) readRow(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, key string, bodyLimit int, lock bool) (*pgRow, error) {
	query := b.sql(selectRow)
	if lock {
		query += " FOR UPDATE NOWAIT"
	}
	var r pgRow
	err := q.QueryRow(ctx, query, key, bodyLimit).Scan(&r.state, &r.token, &r.fingerprint, &r.epoch,
		&r.leaseUntil, &r.ttlUntil, &r.expiresAt, &r.watched, &r.status, &r.headers, &r.body, &r.bodyLen,
		&r.omitted, &r.updated, &r.now)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
			return nil, errors.New("the row is locked by a transaction in progress (a transactional route committing it?): try again")
		}
		return nil, err
	}
	return &r, nil
}

// decode turns a row into a record, judging it as pgstore does.
func (b *pgBackend) decode(key string, r *pgRow, full bool) *record {
	rec := &record{
		Key: key, Location: b.location(key), ServerTime: r.now,
		Epoch: r.epoch, Token: r.token, Fingerprint: r.fingerprint, Watched: r.watched, Body: r.body,
	}
	upd := r.now.Sub(r.updated)
	rec.Updated = &upd
	if r.expiresAt != nil {
		d := r.expiresAt.Sub(r.now)
		rec.ExpiresIn = &d
	}
	if r.bodyLen != nil {
		rec.BodyLen = int64(*r.bodyLen)
	}
	if r.status != nil {
		rec.Status = int(*r.status)
	}
	if r.omitted != nil {
		rec.BodyOmitted = *r.omitted
	}
	corrupt := func(problem string) *record {
		rec.State, rec.Problem = stateCorrupt, problem
		return rec
	}
	switch r.state {
	case stateInProgress:
		rec.LeaseEnd = r.leaseUntil
		left := r.leaseUntil.Sub(r.now)
		rec.LeaseLeft = &left
	case stateComplete:
		if r.status == nil || r.omitted == nil || r.bodyLen == nil || (full && r.headers == nil) {
			return corrupt("a COMPLETE row without status, headers, body or body_omitted")
		}
		if full {
			resp, err := wire.Decode(string(r.headers), "")
			if err != nil {
				return corrupt(err.Error())
			}
			if resp.Status != rec.Status || resp.BodyOmitted != rec.BodyOmitted {
				return corrupt(fmt.Sprintf("status %d and body_omitted %v disagree with the headers block (%d, %v)",
					rec.Status, rec.BodyOmitted, resp.Status, resp.BodyOmitted))
			}
			rec.Header = resp.Header
		}
	default:
		return corrupt("column state holds an unknown value " + strconv.Quote(r.state))
	}
	rec.State = r.state
	if rec.ExpiresIn != nil && *rec.ExpiresIn <= 0 {
		rec.State = stateExpired
		rec.Problem = ""
	}
	return rec
}

func (b *pgBackend) inspect(ctx context.Context, key string, bodyLimit int) (*record, error) {
	r, err := b.readRow(ctx, b.conn, key, bodyLimit, false)
	if err != nil || r == nil {
		return nil, err
	}
	return b.decode(key, r, true), nil
}

func (b *pgBackend) remove(ctx context.Context, key string, rule removal) (*record, error) {
	tx, err := b.conn.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	r, err := b.readRow(ctx, tx, key, 0, true)
	if err != nil {
		return nil, err
	}
	if r == nil {
		return nil, errNotFound
	}
	rec := b.decode(key, r, true)
	if rule.release && rec.State == stateExpired {
		return nil, errNotFound // absent to requests already
	}
	if err := rule.judge(rec); err != nil {
		return rec, err
	}
	if _, err := tx.Exec(ctx, b.sql(`DELETE FROM {table} WHERE key = $1::text`), key); err != nil {
		return nil, err
	}
	if r.watched {
		// As pgstore's release: waiters re-check when the row is gone.
		if _, err := tx.Exec(ctx, `SELECT pg_notify($1::text, $2::text)`, b.table.name, key); err != nil {
			return nil, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, err
	}
	return rec, nil
}

// listPage reads a page of rows after a key, in key order.
const listPage = `
SELECT key, state, token, epoch, lease_until, ttl_until, expires_at, watched, status, length(body), body_omitted,
	updated_at, clock_timestamp()
FROM {table} WHERE key > $1::text ORDER BY key LIMIT $2::integer`

func (b *pgBackend) list(ctx context.Context, c *cli, opts listOptions, emit func(*record) error) error {
	prog := newProgress(c, opts.quiet, "rows")
	prog.node = b.table.name
	defer prog.done()
	after := ""
	for {
		rows, err := b.conn.Query(ctx, b.sql(listPage), after, opts.batch)
		if err != nil {
			return err
		}
		var page []*record
		for rows.Next() {
			var key string
			var r pgRow
			if err := rows.Scan(&key, &r.state, &r.token, &r.epoch, &r.leaseUntil, &r.ttlUntil, &r.expiresAt,
				&r.watched, &r.status, &r.bodyLen, &r.omitted, &r.updated, &r.now); err != nil {
				rows.Close()
				return err
			}
			rec := b.decode(key, &r, false)
			rec.Age = opts.ageFrom(r.ttlUntil.Sub(r.now))
			page = append(page, rec)
			after = key
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		prog.scanned += int64(len(page))
		for _, rec := range page {
			if opts.selects(rec) {
				prog.matched++
				if err := emit(rec); err != nil {
					return err
				}
			}
		}
		prog.tick()
		if len(page) < opts.batch {
			return nil
		}
		if opts.pause > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(opts.pause):
			}
		}
	}
}

// statsQuery counts the rows by group, with their body and row bytes.
const statsQuery = `
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS n)
SELECT CASE
		WHEN r.expires_at IS NULL THEN 'corrupt'
		WHEN r.expires_at <= now.n THEN 'expired'
		WHEN r.state = 'complete' THEN 'complete'
		WHEN r.lease_until > now.n THEN 'in_progress_live'
		ELSE 'in_progress_ran_out'
	END,
	count(*), coalesce(sum(length(r.body)), 0)::bigint, coalesce(sum(pg_column_size(r.*)), 0)::bigint
FROM {table} r, now
GROUP BY 1`

func (b *pgBackend) stats(ctx context.Context, _ *cli, _ statsOptions) (*statsResult, error) {
	res := newStatsResult(b.describe())
	rows, err := b.conn.Query(ctx, b.sql(statsQuery))
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var name string
		var n, body, bytes int64
		if err := rows.Scan(&name, &n, &body, &bytes); err != nil {
			rows.Close()
			return nil, err
		}
		c := res.category(name)
		c.Records, c.BodyBytes, c.Sampled, c.SampledBytes = n, body, n, bytes
		res.Scanned += n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	t := &tableSize{Table: b.table.name}
	err = b.conn.QueryRow(ctx, `
SELECT pg_total_relation_size(c.oid), pg_relation_size(c.oid), pg_indexes_size(c.oid),
	coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0), greatest(c.reltuples, -1)::bigint
FROM pg_class c WHERE c.oid = to_regclass($1::text)`, b.table.quoted).Scan(&t.Total, &t.Heap, &t.Index, &t.Toast, &t.EstimatedRows)
	if err != nil {
		return nil, fmt.Errorf("table size: %w", err)
	}
	res.Table = t
	res.finish()
	return res, nil
}

// pgColumns are the columns of pgstore's table and their types.
var pgColumns = []struct{ name, typ string }{
	{"key", "text"}, {"state", "text"}, {"token", "text"}, {"fingerprint", "bytea"}, {"epoch", "bigint"},
	{"lease_until", "timestamp with time zone"}, {"ttl_until", "timestamp with time zone"},
	{"expires_at", "timestamp with time zone"}, {"watched", "boolean"}, {"status", "integer"},
	{"headers", "bytea"}, {"body", "bytea"}, {"body_omitted", "boolean"}, {"updated_at", "timestamp with time zone"},
}

// pgCheck judges a PostgreSQL server and pgstore's table.
func (b *pgBackend) check(ctx context.Context, opts checkOptions) (redisstore.Report, error) {
	var out []redisstore.Finding
	add := func(item string, v redisstore.Verdict, value, detail string) {
		out = append(out, redisstore.Finding{Item: item, Verdict: v, Value: value, Detail: detail})
	}
	show := func(name string) (string, error) {
		var v string
		err := b.conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v)
		return v, err
	}

	var versionNum int
	var version string
	if err := b.conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int, current_setting('server_version')").Scan(&versionNum, &version); err != nil {
		return redisstore.Report{}, err
	}
	if versionNum >= 120000 {
		add("version", redisstore.OK, "PostgreSQL "+version, "12 or later: the schema's stored generated column works")
	} else {
		add("version", redisstore.Fail, "PostgreSQL "+version, "pgstore needs PostgreSQL 12 or later (a stored generated column)")
	}

	var standby bool
	if err := b.conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&standby); err != nil {
		return redisstore.Report{}, err
	}
	if standby {
		add("recovery", redisstore.Fail, "standby", "this server is a standby: it refuses every write of the store; connect to the primary")
	} else {
		add("recovery", redisstore.OK, "primary", "writes go here")
	}

	var exists bool
	if err := b.conn.QueryRow(ctx, "SELECT to_regclass($1::text) IS NOT NULL", b.table.quoted).Scan(&exists); err != nil {
		return redisstore.Report{}, err
	}
	if !exists {
		add("table", redisstore.Fail, b.table.name+" missing",
			"the table does not exist (in this connection's search_path): run pgstore.Migrate, or the SQL of pgstore.Schema in your migrations")
	} else {
		add("table", redisstore.OK, b.table.name, "exists")
		if err := b.checkTable(ctx, add, opts); err != nil {
			return redisstore.Report{}, err
		}
	}

	fsync, err := show("fsync")
	if err != nil {
		return redisstore.Report{}, err
	}
	if fsync == "on" {
		add("fsync", redisstore.OK, "on", "commits reach the disk")
	} else {
		add("fsync", redisstore.Fail, fsync, "a crash of the server can lose or corrupt committed records; turn fsync on")
	}
	if fpw, err := show("full_page_writes"); err == nil && fpw != "on" {
		add("full_page_writes", redisstore.Warn, fpw, "a crash during a page write can corrupt the table; turn full_page_writes on")
	}

	syncCommit, err := show("synchronous_commit")
	if err != nil {
		return redisstore.Report{}, err
	}
	syncNames, err := show("synchronous_standby_names")
	if err != nil {
		return redisstore.Report{}, err
	}
	switch {
	case syncCommit == "off":
		add("synchronous_commit", redisstore.Warn, "off",
			"a commit is acknowledged before it is on disk: a crash loses the last commits, completed records (and on transactional routes the handler's writes with them), and their keys run again; use on")
	case syncCommit == "local" && syncNames != "":
		add("synchronous_commit", redisstore.Warn, "local",
			"commits do not wait for the synchronous standbys: a failover can lose the last ones; use on or remote_apply")
	default:
		add("synchronous_commit", redisstore.OK, syncCommit, "a commit is on disk before it is acknowledged")
	}

	var standbys int
	if err := b.conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication").Scan(&standbys); err != nil {
		return redisstore.Report{}, err
	}
	switch {
	case standbys == 0:
		add("replication", redisstore.Info, "no standbys streaming from this server", "a failover, if any, is to a copy this server does not feed")
	case syncNames == "":
		add("replication", redisstore.Warn, fmt.Sprintf("%d asynchronous standbys", standbys),
			"a failover to a standby loses the commits it had not received: records, and their keys run again; set synchronous_standby_names (with synchronous_commit on or remote_apply)")
	default:
		add("replication", redisstore.OK, fmt.Sprintf("%d standbys, synchronous_standby_names %q", standbys, syncNames),
			"a commit is on a synchronous standby before it is acknowledged")
	}

	idle, err := show("idle_in_transaction_session_timeout")
	if err != nil {
		return redisstore.Report{}, err
	}
	if idle == "0" {
		add("idle_in_transaction_session_timeout", redisstore.Warn, "0 (none)",
			"a transactional route's transaction abandoned by a frozen process keeps its row locks and connection forever; set it on the application's role (this is what this connection's role sees)")
	} else {
		add("idle_in_transaction_session_timeout", redisstore.OK, idle, "abandoned transactions end")
	}

	av, err := show("autovacuum")
	if err != nil {
		return redisstore.Report{}, err
	}
	if av != "on" {
		add("autovacuum", redisstore.Warn, av, "every request writes, updates and later deletes a row: without autovacuum the table bloats")
	}

	before := time.Now()
	var serverNow time.Time
	if err := b.conn.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&serverNow); err != nil {
		return redisstore.Report{}, err
	}
	mid := before.Add(time.Since(before) / 2)
	add("clock", redisstore.Info, describeClock(serverNow.Sub(mid)),
		"leases and TTLs are judged by the server's clock alone (clock_timestamp()); the application's clocks do not matter")
	return redisstore.Report{Findings: out}, nil
}

// checkTable judges the columns, keys, indexes and purge of the table.
func (b *pgBackend) checkTable(ctx context.Context, add func(string, redisstore.Verdict, string, string), opts checkOptions) error {
	rows, err := b.conn.Query(ctx, `
SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = to_regclass($1::text) AND attnum > 0 AND NOT attisdropped`, b.table.quoted)
	if err != nil {
		return err
	}
	have := map[string]string{}
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			rows.Close()
			return err
		}
		have[name] = typ
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	var wrong []string
	for _, c := range pgColumns {
		switch got, ok := have[c.name]; {
		case !ok:
			wrong = append(wrong, c.name+" missing")
		case got != c.typ:
			wrong = append(wrong, fmt.Sprintf("%s is %s, not %s", c.name, got, c.typ))
		}
	}
	if len(wrong) > 0 {
		add("columns", redisstore.Fail, strings.Join(wrong, "; "), "the table is not pgstore's: compare it with pgstore.Schema")
	} else {
		add("columns", redisstore.OK, fmt.Sprintf("%d columns", len(pgColumns)), "as pgstore.Schema creates them")
	}

	var pk []string
	rows, err = b.conn.Query(ctx, `
SELECT a.attname FROM pg_index x JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = ANY (x.indkey)
WHERE x.indrelid = to_regclass($1::text) AND x.indisprimary`, b.table.quoted)
	if err != nil {
		return err
	}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return err
		}
		pk = append(pk, n)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if slices.Equal(pk, []string{"key"}) {
		add("primary-key", redisstore.OK, "(key)", "one row per storage key: acquire's INSERT ... ON CONFLICT (key) needs it")
	} else {
		add("primary-key", redisstore.Fail, fmt.Sprintf("(%s)", strings.Join(pk, ", ")),
			"the primary key must be (key): acquire's INSERT ... ON CONFLICT (key) needs it")
	}

	// The acquire statement calls <table>_acquire (pgstore.Schema creates
	// it beside the table) whenever a record must be made or changed.
	fn := b.table.acquireFunction()
	var found bool
	if err := b.conn.QueryRow(ctx, `SELECT to_regproc($1::text) IS NOT NULL`, fn).Scan(&found); err != nil {
		return err
	}
	if found {
		add("acquire-function", redisstore.OK, fn, "acquire calls it when a record must be made or changed")
	} else {
		add("acquire-function", redisstore.Fail, fn+" missing",
			"every new key fails without it: run pgstore.Migrate, or the SQL of pgstore.Schema in your migrations")
	}

	var index *string
	err = b.conn.QueryRow(ctx, `
SELECT i.relname::text FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = x.indkey[0]
WHERE x.indrelid = to_regclass($1::text) AND a.attname = 'expires_at' AND x.indisvalid
LIMIT 1`, b.table.quoted).Scan(&index)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	if index != nil {
		add("expires-at-index", redisstore.OK, *index, "the purge walks it from the oldest entry: a batch costs the rows it deletes")
	} else {
		add("expires-at-index", redisstore.Warn, "missing",
			"without an index on expires_at every purge batch scans the whole table; create it (see pgstore.Schema)")
	}

	var reloptions []string
	if err := b.conn.QueryRow(ctx, `SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = to_regclass($1::text)`,
		b.table.quoted).Scan(&reloptions); err != nil {
		return err
	}
	if slices.Contains(reloptions, "autovacuum_enabled=false") {
		add("autovacuum", redisstore.Warn, "off for "+b.table.name,
			"every request writes, updates and later deletes a row: without autovacuum the table bloats")
	}

	if _, ok := have["expires_at"]; !ok {
		add("purge", redisstore.Info, "not checked", "the table has no expires_at column")
		return nil
	}
	var oldest *time.Time
	var now time.Time
	if err := b.conn.QueryRow(ctx, b.sql(`
SELECT (SELECT min(expires_at) FROM {table} WHERE expires_at <= n), n FROM (SELECT clock_timestamp() AS n) now`)).Scan(&oldest, &now); err != nil {
		return err
	}
	switch {
	case oldest == nil:
		add("purge", redisstore.OK, "no row past its expiry", "expired rows are being deleted")
	case now.Sub(*oldest) > opts.purgeLag:
		add("purge", redisstore.Warn, fmt.Sprintf("a row expired %s ago is still there", human(now.Sub(*oldest))),
			"expired rows are absent to requests but take space until purged: run the purge (pgstore.WithPurgeInterval on an instance, or a job calling Store.Purge until it returns a short batch)")
	default:
		add("purge", redisstore.OK, fmt.Sprintf("the oldest row past its expiry expired %s ago", human(now.Sub(*oldest))),
			fmt.Sprintf("within -purge-lag %v", opts.purgeLag))
	}
	return nil
}

func describeClock(d time.Duration) string {
	d = d.Round(time.Millisecond)
	switch {
	case d > 0:
		return d.String() + " ahead of this host"
	case d < 0:
		return (-d).String() + " behind this host"
	}
	return "in step with this host"
}
