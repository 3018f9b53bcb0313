package pgstore

import "strings"

// The statements, one per edge. Each is sent as one query (one round trip)
// and runs as one implicit transaction, or inside the handler's transaction
// for Tx.Complete. "{table}" stands for the quoted table name, "{acquire}"
// for the quoted name of the acquire function that schema.sql installs
// beside the table.
//
// Every statement reads the server's clock once, in now (clock_timestamp()
// in a materialized CTE, or in a subquery whose single row the acquire
// statement joins, so it is read once), and judges every lease and TTL
// against that instant; the acquire statement hands it to its function.
//
// Each statement changes the row with one data-modifying command (INSERT
// ... ON CONFLICT DO UPDATE in the acquire function, UPDATE or DELETE),
// whose WHERE clause is the whole condition for the edge. Under READ
// COMMITTED such a command sees the latest committed version of the row:
// when another transaction changed the row, it waits for that transaction
// to end, locks the row and evaluates its condition again on the new
// version (INSERT ... ON CONFLICT does the same for a row another
// transaction inserted). So the condition and the change are atomic, and
// two edges on one key are ordered by the row lock.
//
// Complete, release and extend run their command first; when it changed
// nothing, the statement reads the row to tell the caller why (completed,
// lease lost, absent). The acquire statement reads the row first, and runs
// its command only when that version asks for a change (see acquireSQL).
// That read is a plain SELECT and sees the statement's snapshot, which can
// be older than the version the command judged: a transaction may have
// committed in between (for instance the INSERT of a concurrent first
// request, which the snapshot does not see at all). The read answers only
// when its version alone settles the answer, which is then true at the
// instant the snapshot was taken (within the call); when it contradicts the
// command (a row the command would have changed, or, for acquire, a row or
// no row that asked for a change the command did not make) the statement
// answers codeRetry, and the store runs it again: the new statement's
// snapshot includes the commit the command waited for. That costs a second
// round trip only to calls that race another call on the same key. (For
// complete, release and extend, no row at all means no record: the
// caller's own acquire committed before, so its row is in the snapshot
// unless it was deleted since.)
//
// The numbers the statements answer with are the constants below.

// Answer codes: the first column of the complete, release and extend
// statements' result, and the first element of the acquire function's;
// Store.Acquire reads the acquire statement's other answers from the row.
const (
	codeCorrupt = -1 // the row is not a record (an unknown state)
	codeRetry   = 0  // the row changed under the statement: run it again

	// acquire
	acquireTaken     = 1 // acquired, stolen or renewed: the epoch says which
	acquireCompleted = 3
	acquireInFlight  = 4
	acquireMismatch  = 5

	// complete, release, extend
	fencedDone    = 1 // the edge happened
	fencedLost    = 2 // absent, expired, COMPLETE (release, extend) or another token's
	fencedAlready = 3 // complete: already COMPLETE under the same token
	fencedAbsent  = 4 // release: no record, or an expired one
)

// acquireSQL is the acquire and steal edges.
//
//	$1 key, $2 token, $3 fingerprint, $4 lease, $5 TTL
//
// It is a SELECT of the row, r, by primary key, from the statement's
// snapshot, left-joined to one reading of the server's clock, now, so that
// it answers one row even when there is no record. (A subquery that calls
// a volatile function is not merged into the query: its one row, read
// once while the statement runs, after the snapshot is taken, is the
// join's outer side.) Its columns are r's state, whether r has the
// caller's fingerprint, r's epoch, lease and expiry, now, r's payload
// (status, headers, body, body_omitted) and, last, written: what the write
// answered, when there was one.
//
// When r alone settles the answer, nothing is written, and the store reads
// the answer from r (see Store.Acquire):
//
//   - a row without expiry (expires_at is NULL for an unknown state) is
//     not a record (codeCorrupt);
//   - a live record with another fingerprint, in progress or COMPLETE
//     (acquireMismatch);
//   - a live COMPLETE record with the same fingerprint (acquireCompleted): a
//     replay, whose payload and expiry come back in the same round trip;
//   - a live record in progress with the same fingerprint under another
//     token's live lease, already watched (acquireInFlight), with the
//     lease left.
//
// Otherwise the record must be made or change: there is no row, or r has
// expired, or it is in progress with the same fingerprint and either held
// by the caller's token (a retried acquire), past its lease, or not yet
// watched. Then, and only then, the CASE of the last column calls the
// acquire function that the schema installs beside the table ({acquire},
// see schema.sql) with now; it runs the write, INSERT ... ON CONFLICT
// (key) DO UPDATE ... WHERE, and answers {code, epoch, lease left in
// microseconds}.
//
// So a replay, a mismatch and a watched record in flight are a plain
// SELECT by primary key: no row lock, no write, no transaction id (the
// implicit commit writes no WAL and waits for no flush), only the ACCESS
// SHARE lock of any read, and none of the INSERT's executor set-up, which
// a plan holding the INSERT would pay on every execution, even when it
// proposes no row (the ON CONFLICT projections, the indexes, the stored
// generated column's expression). Concurrent replays of one key do not
// wait for each other, nor for a transaction holding the row.
//
// The write proposes a fresh record (epoch 1, lease and TTL from now). The
// proposed row, excluded, carries now as updated_at, and its lease and TTL
// deadlines. When the key exists, ON CONFLICT DO UPDATE locks the row's
// latest version, r, however recent, and changes it in four cases:
//
//   - r has expired (past its TTL, and past its lease while in progress):
//     it is absent, so the caller gets a fresh record at epoch 1;
//   - r is in progress with the same fingerprint and held by the caller's
//     token (a retried acquire): same epoch, the lease renewed to run at
//     least the lease from now, never shortened, even when it had run out
//     (no other token took the record over, or the token would differ);
//   - r is in progress with the same fingerprint and its lease has run
//     out: a steal, epoch + 1, a new lease and TTL;
//   - r is in progress with the same fingerprint under another token's
//     live lease, and not yet watched: the caller is a duplicate in
//     flight. Only watched is set (see Store.Watch), so that the holder's
//     complete or release notifies: a duplicate waiting for the record may
//     have registered before the record existed.
//
// In the first three cases the caller runs the handler, and the new epoch
// says how: 1 is Acquired, more is Stolen. Those rows, and the fourth
// case's, come back through RETURNING: the version of the row that the
// command locked and judged (code 1 when the caller's token holds it, 4
// when another's does). So every write is judged on the latest version,
// under its lock, as the statements above are.
//
// The function is VOLATILE, so under READ COMMITTED its INSERT runs with a
// snapshot of its own, taken after the SELECT's; ON CONFLICT judges the
// latest version whatever the snapshot. It runs in the statement's
// transaction, so its row lock is held until the statement commits. When
// the command changed nothing although the SELECT asked for a change, r
// differs from the version the SELECT read: a transaction committed after
// the snapshot (the snapshot shows a row the command would have changed,
// or none: the INSERT of a concurrent first request). The function answers
// code 0 (codeRetry), and the store runs the statement again with a
// snapshot that includes that commit.
//
// Why an answer from the snapshot alone is right. The snapshot is taken
// when the statement starts, at instant S, and now is read after it, at
// T >= S, both within the call. r is the version of the row that was the
// latest at S, and the statement judges its deadlines against T, so a
// deadline it finds still ahead was ahead at S too:
//
//   - a live COMPLETE record with the same fingerprint (a replay) is still
//     the latest version at T: a COMPLETE record changes only by expiring.
//     Complete, release, extend and Watch change in-progress rows only,
//     the ON CONFLICT update and the purge change a COMPLETE row only once
//     expired on their own clock reading, after its TTL deadline, which
//     is after T. So the replay is true at T, and the payload is the
//     record's;
//   - another fingerprint (a mismatch) was the record's at S: the record
//     was live at S, and a live record's fingerprint never changes (the
//     update sets it only on an expired record, or to the same one). The
//     record may have been released or completed since, but at S it was
//     there with that fingerprint, so Mismatch was true at S;
//   - in flight: at S the record was in progress under another token's
//     lease ending after T, so InFlight was true at S, and the remaining
//     lease, counted from T, is no longer than what remained at S. The
//     record was watched at S, and stays watched until it is released,
//     completed or expires (no edge clears the flag on a live record), so
//     a waiter that goes on to watch it is notified of the holder's
//     complete or release. Were the record stolen, completed or released
//     since S, the waiter's re-check sees it;
//   - a row that is not a record is left as it is, whatever the write
//     would have judged: an edge never writes one.
//
// Every answer the write gives is judged on the locked latest version, so
// two acquires that both change a record are ordered by its row lock.
const acquireSQL = `
SELECT r.state, r.fingerprint = $3::bytea, r.epoch, r.lease_until, r.expires_at, now.n,
	r.status, r.headers, r.body, r.body_omitted,
	CASE
		WHEN r.key IS NULL OR r.expires_at <= now.n
			OR (r.state = 'in_progress' AND r.fingerprint = $3::bytea
				AND (r.token = $2::text OR r.lease_until <= now.n OR NOT r.watched))
		THEN {acquire}($1::text, $2::text, $3::bytea, $4::interval, $5::interval, now.n)
	END
FROM (SELECT clock_timestamp() AS n) now
LEFT JOIN {table} r ON r.key = $1::text`

// completeSQL is the complete edge, for Store.Complete and, inside the
// handler's transaction, for Tx.Complete (the fence).
//
//	$1 key, $2 token, $3 status, $4 headers, $5 body, $6 body omitted,
//	$7 TTL, $8 channel
//
// The UPDATE is the fence: it changes the row only while it is in
// progress under the caller's token and has not expired. Its row lock
// orders it against a concurrent steal: a steal that locked the row first
// has changed the token by the time the UPDATE evaluates its condition
// again, and a steal that comes second waits for the UPDATE's transaction
// to end and then finds the record COMPLETE. A watched record is announced
// with pg_notify, delivered when the transaction commits.
const completeSQL = `
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS n),
done AS (
	UPDATE {table} AS r SET
		state = 'complete',
		status = $3::integer, headers = $4::bytea, body = $5::bytea, body_omitted = $6::boolean,
		ttl_until = now.n + $7::interval,
		updated_at = now.n
	FROM now
	WHERE r.key = $1::text AND r.token = $2::text AND r.state = 'in_progress' AND r.expires_at > now.n
	RETURNING r.watched
),
notified AS (SELECT pg_notify($8::text, $1) FROM done WHERE done.watched)
SELECT 1 AS code, (SELECT count(*) FROM notified) AS notified, NULL::text AS state
FROM done
UNION ALL
SELECT
	CASE
		WHEN r.expires_at IS NULL THEN -1
		WHEN r.expires_at <= now.n OR r.token <> $2 THEN 2
		WHEN r.state = 'complete' THEN 3
		ELSE 0
	END,
	0, r.state
FROM {table} r, now
WHERE r.key = $1 AND NOT EXISTS (SELECT FROM done)`

// releaseSQL is the release edge.
//
//	$1 key, $2 token, $3 channel
//
// The DELETE removes the row only while it is in progress under the
// caller's token and has not expired, ordered against other edges by the
// row lock as completeSQL is. No row, or an expired one, is an absent
// record: released already.
const releaseSQL = `
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS n),
done AS (
	DELETE FROM {table} AS r
	USING now
	WHERE r.key = $1::text AND r.token = $2::text AND r.state = 'in_progress' AND r.expires_at > now.n
	RETURNING r.watched
),
notified AS (SELECT pg_notify($3::text, $1) FROM done WHERE done.watched)
SELECT 1 AS code, (SELECT count(*) FROM notified) AS notified, NULL::text AS state
FROM done
UNION ALL
SELECT
	CASE
		WHEN r.expires_at IS NULL THEN -1
		WHEN r.expires_at <= now.n THEN 4
		WHEN r.state = 'complete' OR r.token <> $2 THEN 2
		ELSE 0
	END,
	0, r.state
FROM {table} r, now
WHERE r.key = $1 AND NOT EXISTS (SELECT FROM done)`

// extendSQL is the extend edge (the heartbeat).
//
//	$1 key, $2 token, $3 lease
//
// The lease runs the given length from now. The record's expiry follows
// (expires_at is computed from lease_until). When the UPDATE changed
// nothing the lease is lost, whatever the snapshot shows: the UPDATE
// judged the latest version. The second branch only tells a row that is
// not a record.
const extendSQL = `
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS n),
done AS (
	UPDATE {table} AS r SET
		lease_until = now.n + $3::interval,
		updated_at = now.n
	FROM now
	WHERE r.key = $1::text AND r.token = $2::text AND r.state = 'in_progress' AND r.expires_at > now.n
	RETURNING 1
)
SELECT 1 AS code, 0::bigint AS notified, NULL::text AS state
FROM done
UNION ALL
SELECT CASE WHEN r.expires_at IS NULL THEN -1 ELSE 2 END, 0, r.state
FROM {table} r
WHERE r.key = $1 AND NOT EXISTS (SELECT FROM done)`

// markSQL marks a record in progress as watched (see Store.Watch), so that
// complete and release notify. A record already marked is not written
// again.
//
//	$1 key
const markSQL = `UPDATE {table} SET watched = true WHERE key = $1::text AND state = 'in_progress' AND NOT watched`

// purgeSQL deletes at most $1 expired records, oldest first.
//
// The cut-off is read once, in an InitPlan (a scalar subquery), so the
// index on expires_at serves the range, and the rows found are deleted by
// primary key: a batch costs the rows it deletes. FOR UPDATE SKIP LOCKED
// leaves the rows that a concurrent edge or purge holds; a row that
// another transaction changed after the snapshot is checked again on its
// new version (a record acquired anew is no longer expired), and the lock
// keeps it from changing before the DELETE.
const purgeSQL = `
DELETE FROM {table}
WHERE key = ANY (ARRAY(
	SELECT key FROM {table}
	WHERE expires_at <= (SELECT clock_timestamp())
	ORDER BY expires_at
	LIMIT $1::integer
	FOR UPDATE SKIP LOCKED
))`

// statements holds the statements for one table.
type statements struct {
	acquire, complete, release, extend, mark, purge string
}

func newStatements(t table) statements {
	put := strings.NewReplacer("{table}", t.quoted, "{acquire}", t.acquire).Replace
	return statements{
		acquire:  put(acquireSQL),
		complete: put(completeSQL),
		release:  put(releaseSQL),
		extend:   put(extendSQL),
		mark:     put(markSQL),
		purge:    put(purgeSQL),
	}
}
