package pgstore

import "strings"

// The statements, one per edge. Each is sent as one query (one round trip)
// and runs as one implicit transaction, or inside the handler's transaction
// for Tx.Complete. "{table}" stands for the quoted table name.
//
// Every statement reads the server's clock once, in the CTE now
// (clock_timestamp(), materialized so it is read once), and judges every
// lease and TTL against that instant.
//
// Each statement changes the row with one data-modifying command (INSERT
// ... ON CONFLICT DO UPDATE, UPDATE or DELETE), whose WHERE clause is the
// whole condition for the edge. Under READ COMMITTED such a command sees
// the latest committed version of the row: when another transaction
// changed the row, it waits for that transaction to end, locks the row and
// evaluates its condition again on the new version (INSERT ... ON CONFLICT
// does the same for a row another transaction inserted). So the condition
// and the change are atomic, and two edges on one key are ordered by the
// row lock.
//
// When the command changed nothing, the statement reads the row to tell
// the caller why (in flight, completed, mismatch, lease lost). That read is
// a plain SELECT and sees the statement's snapshot, which can be older than
// the version the command judged: a transaction may have committed in
// between (for instance the INSERT of a concurrent first request, which
// the snapshot does not see at all). The read answers only when its version
// alone settles the answer, which is then true at the instant the snapshot
// was taken (within the call); when it contradicts the command (a row the
// command would have changed, or, for acquire, no row at all) it answers
// codeRetry, and the store runs the statement again: the new statement's
// snapshot includes the commit it waited for. That costs a second round
// trip only to calls that race another call on the same key. (For
// complete, release and extend, no row at all means no record: the
// caller's own acquire committed before, so its row is in the snapshot
// unless it was deleted since.)
//
// The numbers the statements answer with are the constants below.

// Answer codes, in the first column of every statement's result.
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
// The statement first reads the row, cur, from its snapshot, and judges
// it against now: code says what that version alone settles. A nonzero
// code is the answer and nothing is written: -1 a row that is not a
// record, 5 another fingerprint (live, in progress or COMPLETE), 3 a live
// COMPLETE record with the same fingerprint (a replay, whose payload comes
// back in the same round trip), 4 in flight under another token's live
// lease and already watched. Zero means the record may have to change
// (expired, the caller's own token, a lease that has run out, not yet
// watched), and no row means there is no record.
//
// Only then does the INSERT propose a row: its SELECT produces none when
// cur settled the answer, so ON CONFLICT is never reached, and the
// statement locks no row, writes nothing and takes no transaction id (its
// implicit commit writes no WAL and waits for no flush); concurrent
// replays of one key do not wait for each other, nor for a transaction
// holding the row. The relation lock every INSERT takes (ROW EXCLUSIVE)
// stays; it conflicts with none of the edges' locks.
//
// The INSERT proposes a fresh record (epoch 1, lease and TTL from now).
// The proposed row, excluded, carries now as updated_at, and its lease and
// TTL deadlines. When the key exists, ON CONFLICT DO UPDATE locks the
// row's latest version, r, however recent, and changes it in four cases:
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
// command locked and judged. So every write is judged on the latest
// version, under its lock, as the statements above are.
//
// When the command changed nothing although cur asked for it, r differs
// from cur: a transaction committed after the snapshot (cur shows a row
// the command would have changed, or none: the INSERT of a concurrent
// first request). The statement answers codeRetry, or no row at all, and
// the store runs it again with a snapshot that includes that commit.
//
// Why an answer from the snapshot alone is right. The snapshot is taken
// when the statement starts, at instant S, and now is read after it, at
// T >= S, both within the call. cur is the version of the row that was
// the latest at S, and its code judges its deadlines against T, so a
// deadline it finds still ahead was ahead at S too:
//
//   - a live COMPLETE record with the same fingerprint (3) is still the
//     latest version at T: a COMPLETE record changes only by expiring.
//     Complete, release, extend and Watch change in-progress rows only,
//     the ON CONFLICT update and the purge change a COMPLETE row only once
//     expired on their own clock reading, after its TTL deadline, which
//     is after T. So the replay is true at T, and the payload is the
//     record's;
//   - another fingerprint (5) was the record's at S: the record was live
//     at S, and a live record's fingerprint never changes (the update sets
//     it only on an expired record, or to the same one). The record may
//     have been released or completed since, but at S it was there with
//     that fingerprint, so Mismatch was true at S;
//   - in flight (4): at S the record was in progress under another
//     token's lease ending after T, so InFlight was true at S, and the
//     remaining lease, counted from T, is no longer than what remained at
//     S. The record was watched at S, and stays watched until it is
//     released, completed or expires (no edge clears the flag on a live
//     record), so a waiter that goes on to watch it is notified of the
//     holder's complete or release. Were the record stolen, completed or
//     released since S, the waiter's re-check sees it;
//   - a row that is not a record (-1) is left as it is, whatever the
//     command would have judged: an edge never writes one.
//
// Every answer the write path gives is judged on the locked latest
// version, as before, so two acquires that both change a record are
// ordered by its row lock.
const acquireSQL = `
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS n),
cur AS MATERIALIZED (
	SELECT
		CASE
			WHEN r.expires_at IS NULL THEN -1
			WHEN r.expires_at <= now.n THEN 0
			WHEN r.fingerprint <> $3::bytea THEN 5
			WHEN r.state = 'complete' THEN 3
			WHEN r.token = $2::text OR r.lease_until <= now.n OR NOT r.watched THEN 0
			ELSE 4
		END AS code,
		r.epoch, r.lease_until, r.state, r.status, r.headers, r.body, r.body_omitted
	FROM {table} r, now
	WHERE r.key = $1::text
),
changed AS (
	INSERT INTO {table} AS r
		(key, state, token, fingerprint, epoch, lease_until, ttl_until, updated_at)
	SELECT $1::text, 'in_progress', $2::text, $3::bytea, 1, n + $4::interval, n + $5::interval, n
	FROM now
	WHERE NOT EXISTS (SELECT FROM cur WHERE cur.code <> 0)
	ON CONFLICT (key) DO UPDATE SET
		state = 'in_progress',
		fingerprint = excluded.fingerprint,
		token = CASE
			WHEN r.expires_at > excluded.updated_at AND r.token <> excluded.token
				AND r.lease_until > excluded.updated_at
			THEN r.token -- in flight
			ELSE excluded.token
		END,
		epoch = CASE
			WHEN r.expires_at <= excluded.updated_at THEN 1
			WHEN r.token = excluded.token OR r.lease_until > excluded.updated_at THEN r.epoch
			ELSE r.epoch + 1
		END,
		lease_until = CASE
			WHEN r.expires_at <= excluded.updated_at THEN excluded.lease_until
			WHEN r.token = excluded.token THEN greatest(r.lease_until, excluded.lease_until)
			WHEN r.lease_until <= excluded.updated_at THEN excluded.lease_until
			ELSE r.lease_until -- in flight
		END,
		ttl_until = CASE
			WHEN r.expires_at <= excluded.updated_at
				OR (r.token <> excluded.token AND r.lease_until <= excluded.updated_at)
			THEN excluded.ttl_until
			ELSE r.ttl_until
		END,
		watched = CASE
			WHEN r.expires_at <= excluded.updated_at THEN false
			WHEN r.token <> excluded.token AND r.lease_until > excluded.updated_at THEN true
			ELSE r.watched
		END,
		status = NULL, headers = NULL, body = NULL, body_omitted = NULL,
		updated_at = CASE
			WHEN r.expires_at > excluded.updated_at AND r.token <> excluded.token
				AND r.lease_until > excluded.updated_at
			THEN r.updated_at -- in flight
			ELSE excluded.updated_at
		END
	WHERE r.expires_at <= excluded.updated_at
		OR (r.state = 'in_progress' AND r.fingerprint = excluded.fingerprint
			AND (r.token = excluded.token OR r.lease_until <= excluded.updated_at OR NOT r.watched))
	RETURNING r.token, r.epoch, r.lease_until
)
SELECT CASE WHEN c.token = $2 THEN 1 ELSE 4 END AS code,
	c.epoch,
	ceil(extract(epoch FROM c.lease_until - now.n) * 1000000)::bigint AS remaining_us,
	NULL::text AS state,
	NULL::integer AS status, NULL::bytea AS headers, NULL::bytea AS body,
	NULL::boolean AS body_omitted
FROM changed c, now
UNION ALL
SELECT
	cur.code,
	cur.epoch,
	ceil(extract(epoch FROM cur.lease_until - now.n) * 1000000)::bigint,
	cur.state,
	CASE WHEN cur.state = 'complete' THEN cur.status END,
	CASE WHEN cur.state = 'complete' THEN cur.headers END,
	CASE WHEN cur.state = 'complete' THEN cur.body END,
	CASE WHEN cur.state = 'complete' THEN cur.body_omitted END
FROM cur, now
WHERE NOT EXISTS (SELECT FROM changed)`

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
	put := func(s string) string { return strings.ReplaceAll(s, "{table}", t.quoted) }
	return statements{
		acquire:  put(acquireSQL),
		complete: put(completeSQL),
		release:  put(releaseSQL),
		extend:   put(extendSQL),
		mark:     put(markSQL),
		purge:    put(purgeSQL),
	}
}
