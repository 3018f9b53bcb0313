package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/go-idempotency/idempotency/internal/pgname"
	"github.com/go-idempotency/idempotency/internal/wire"
	"github.com/go-idempotency/idempotency/servercheck"
)

// pgBackend works on pgstore's records: one row per record (see
// pgstore/README.md and schema.sql).
type pgBackend struct {
	conn  *pgx.Conn
	table pgname.Table
	where string
}

func (b *pgBackend) describe() string { return fmt.Sprintf("%s, table %s", b.where, b.table.String()) }

func (b *pgBackend) location(key string) string {
	return fmt.Sprintf("%s row %s", b.table.String(), key)
}

func (b *pgBackend) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b.conn.Close(ctx)
}

// sql returns query with {table} replaced by the quoted table name.
func (b *pgBackend) sql(query string) string {
	return strings.ReplaceAll(query, "{table}", b.table.Quoted())
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
		if _, err := tx.Exec(ctx, `SELECT pg_notify($1::text, $2::text)`, b.table.String(), key); err != nil {
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
	prog.node = b.table.String()
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
		if err := sleep(ctx, opts.pause); err != nil {
			return err
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
	t := &tableSize{Table: b.table.String()}
	err = b.conn.QueryRow(ctx, `
SELECT pg_total_relation_size(c.oid), pg_relation_size(c.oid), pg_indexes_size(c.oid),
	coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0), greatest(c.reltuples, -1)::bigint
FROM pg_class c WHERE c.oid = to_regclass($1::text)`, b.table.Quoted()).Scan(&t.Total, &t.Heap, &t.Index, &t.Toast, &t.EstimatedRows)
	if err != nil {
		return nil, fmt.Errorf("table size: %w", err)
	}
	res.Table = t
	res.finish()
	return res, nil
}

func (b *pgBackend) check(ctx context.Context, opts checkOptions) (servercheck.Report, error) {
	return servercheck.Postgres(ctx, b.conn, b.table.String(), servercheck.WithPurgeLag(opts.purgeLag))
}
