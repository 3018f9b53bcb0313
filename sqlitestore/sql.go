package sqlitestore

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
)

// The statements. "{table}" stands for the quoted table name. Every time
// is an INTEGER of unix microseconds computed in Go from the Store's clock
// and passed as an argument; no statement reads SQLite's clock.
//
// A replay, a mismatch and a duplicate in flight are answered by readSQL
// alone, outside any transaction: in WAL mode a read sees the last commit
// and neither waits for a writer nor makes one wait (Store.read runs it on
// the writer's connection only while no write of the Store runs). Every
// write but createSQL runs in a BEGIN IMMEDIATE transaction, which takes
// the file's write lock before its first statement: the Store reads the row
// again under the lock, decides in Go, and writes with one of the
// statements below. Each write statement also carries its condition in its
// WHERE clause (the fence), which under the lock holds by construction, and
// which Tx.Complete relies on inside the handler's transaction.

// readSQL reads one record.
//
//	?1 key
const readSQL = `SELECT state, token, fingerprint, epoch, lease_until, ttl_until, status, headers, body, body_omitted
FROM {table} WHERE key = ?1`

// insertSQL writes a record in progress, of the arguments of takeSQL and
// createSQL, when no row has the key. An empty fingerprint is an empty
// BLOB (see completeSQL for the coalesce).
//
//	?1 key, ?2 token, ?3 fingerprint, ?4 epoch, ?5 lease_until,
//	?6 ttl_until, ?7 now
const insertSQL = `INSERT INTO {table}
	(key, state, token, fingerprint, epoch, lease_until, ttl_until, expires_at, status, headers, body, body_omitted, updated_at)
VALUES (?1, 'in_progress', ?2, coalesce(?3, x''), ?4, ?5, ?6, max(?5, ?6), NULL, NULL, NULL, NULL, ?7)`

// takeSQL writes a record in progress whatever row has the key: a fresh
// one (epoch 1), a steal (epoch + 1) or the holder's retry (the same
// epoch, a lease that is never shortened). Whatever payload the row had
// is cleared. Its arguments are insertSQL's.
const takeSQL = insertSQL + `
ON CONFLICT (key) DO UPDATE SET
	state = excluded.state, token = excluded.token, fingerprint = excluded.fingerprint,
	epoch = excluded.epoch, lease_until = excluded.lease_until, ttl_until = excluded.ttl_until,
	expires_at = excluded.expires_at,
	status = NULL, headers = NULL, body = NULL, body_omitted = NULL,
	updated_at = excluded.updated_at`

// createSQL is the fresh edge of a key that has no row, as one statement
// that commits on its own: a record in progress at epoch 1, written only
// while no row has the key. Acquire runs it when its read found no row;
// when one appeared since, it changes nothing, and Acquire decides again
// under the lock (takeSQL). Neither a read under the lock nor BEGIN and
// COMMIT: the first execution of a new key, the common one, writes once.
// Its arguments are insertSQL's.
const createSQL = insertSQL + `
ON CONFLICT (key) DO NOTHING`

// completeSQL is the complete edge, and the fence of Tx.Complete: it
// changes the row only while it is in progress under the token and not
// expired. The Store passes a nil []byte for an empty body, which the
// driver binds as NULL, hence the coalesce: an empty body is an empty
// BLOB, a NULL one a corrupt row.
//
//	?1 key, ?2 token, ?3 status, ?4 headers, ?5 body, ?6 body omitted,
//	?7 ttl_until, ?8 now
const completeSQL = `UPDATE {table} SET
	state = 'complete', status = ?3, headers = ?4, body = coalesce(?5, x''), body_omitted = ?6,
	ttl_until = ?7, expires_at = ?7, updated_at = ?8
WHERE key = ?1 AND token = ?2 AND state = 'in_progress' AND max(lease_until, ttl_until) > ?8`

// releaseSQL is the release edge.
//
//	?1 key, ?2 token, ?3 now
const releaseSQL = `DELETE FROM {table}
WHERE key = ?1 AND token = ?2 AND state = 'in_progress' AND max(lease_until, ttl_until) > ?3`

// extendSQL is the extend edge (the heartbeat): the lease runs from now,
// and the record's expiry follows.
//
//	?1 key, ?2 token, ?3 lease_until, ?4 now
const extendSQL = `UPDATE {table} SET
	lease_until = ?3, expires_at = max(ttl_until, ?3), updated_at = ?4
WHERE key = ?1 AND token = ?2 AND state = 'in_progress' AND max(lease_until, ttl_until) > ?4`

// purgeSQL deletes at most ?2 records expired at ?1, oldest first, along
// the index on expires_at.
const purgeSQL = `DELETE FROM {table} WHERE key IN (
	SELECT key FROM {table} WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2)`

// pollSQL reads the holders of the watched records whose keys ?1 lists, as
// a JSON array: one statement per poll, whatever the number of keys.
const pollSQL = `SELECT key, state, token, lease_until, ttl_until
FROM {table} WHERE key IN (SELECT value FROM json_each(?1))`

// statements are the statements above on one table, prepared once by
// Open on the Store's *sql.DB and closed by Close. database/sql prepares a
// statement on a connection the first time it runs there and keeps it for
// that connection; inside a transaction, Tx.StmtContext finds it. Parsing
// and planning is much of a call's cost in modernc.org/sqlite: when every
// write prepared its SQL again, sqlite3_prepare_v2 took about 29% of the
// CPU of first executions.
type statements struct {
	read, create, take, complete, release, extend, purge, poll *sql.Stmt
	// writes are those of the write transactions with their SQL, which
	// the writer prepares again on its connection.
	writes []prepared
}

// prepared is a statement of the Store and the SQL it was prepared from.
type prepared struct {
	stmt  *sql.Stmt
	query string
}

// prepare prepares the statements on t in db.
func prepare(ctx context.Context, db *sql.DB, t table) (statements, error) {
	put := strings.NewReplacer("{table}", t.quoted).Replace
	var st statements
	for _, p := range []struct {
		name string
		stmt **sql.Stmt
		sql  string
	}{
		{"read", &st.read, readSQL},
		{"create", &st.create, createSQL},
		{"take", &st.take, takeSQL},
		{"complete", &st.complete, completeSQL},
		{"release", &st.release, releaseSQL},
		{"extend", &st.extend, extendSQL},
		{"purge", &st.purge, purgeSQL},
		{"poll", &st.poll, pollSQL},
	} {
		var err error
		if *p.stmt, err = db.PrepareContext(ctx, put(p.sql)); err != nil {
			st.close()
			return statements{}, fmt.Errorf("prepare the %s statement: %w", p.name, err)
		}
		if p.name != "poll" {
			st.writes = append(st.writes, prepared{*p.stmt, put(p.sql)})
		}
	}
	return st, nil
}

// close closes the statements that were prepared.
func (st *statements) close() {
	for _, s := range []*sql.Stmt{st.read, st.create, st.take, st.complete, st.release, st.extend, st.purge, st.poll} {
		if s != nil {
			s.Close()
		}
	}
}
