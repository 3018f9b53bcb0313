package load

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency/pgstore"
)

// The record floor of PostgreSQL: plain statements on a table of the
// store's own schema (pgstore.Schema: the same columns and indexes,
// FloorTable) that read the server's clock with now(). A first execution
// inserts its in-progress row (RecordNewSQL: key, token, fingerprint,
// lease, TTL) and stores its payload in it (RecordDoneSQL: key, status,
// header block, body, TTL); a duplicate reads it back (RecordReadSQL).
const (
	FloorTable    = "floor_records"
	RecordReadSQL = `SELECT status, headers, body FROM floor_records WHERE key = $1`
	RecordNewSQL  = `INSERT INTO floor_records (key, state, token, fingerprint, epoch, lease_until, ttl_until, updated_at)
VALUES ($1, 'in_progress', $2, $3, 1, now() + $4::interval, now() + $5::interval, now())`
	RecordDoneSQL = `UPDATE floor_records SET state = 'complete', status = $2, headers = $3, body = $4, body_omitted = false,
	ttl_until = now() + $5::interval, updated_at = now() WHERE key = $1`
)

// MigrateFloor makes the store's table and the floor's in the database of
// pool.
func MigrateFloor(ctx context.Context, pool *pgxpool.Pool) error {
	if err := pgstore.Migrate(ctx, pool); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, pgstore.Schema(FloorTable))
	return err
}
