package relay

import (
	"strings"

	"github.com/go-idempotency/idempotency/internal/pgname"
)

// The statements of a relay. Each is one command, run as its own implicit
// transaction on the pool, under READ COMMITTED, and every deadline in them
// is read from the server's clock (clock_timestamp()); the relay sends
// durations, never times.
//
// Each mark (done, retry, release) is fenced: it changes the row only while
// it is claimed under the token of the claim that presented it. A claim
// that ran out and was taken back (reclaimSQL) has no token any more, and a
// new claim has another: the first relay's marks change nothing. An UPDATE
// under READ COMMITTED judges the row's latest version under its lock, so
// a mark and a reclaim of one row are ordered by that lock, and whichever
// comes second finds the row changed.

// claimSQL claims up to $1 due messages for a claim with token $2 by relay
// $3, for a lease of $4, and returns them.
//
// A message is due when it is pending, its next_attempt_at has passed, and
// no earlier message (a smaller id) of its ordering key is pending or
// claimed: a key's messages are presented one at a time, in id order, and
// a batch holds at most one of each key. Done and dead messages block
// nothing. The check reads the statement's snapshot; it can only find a
// message still pending or claimed that has ended since (a key then waits
// for the next claim), never the reverse: a message of a key is pending
// only before its first presentation or between two of them, and an
// earlier one cannot become pending again except by an operator's requeue
// of a dead message.
//
// FOR UPDATE SKIP LOCKED leaves the rows another relay's claim is locking,
// and a row claimed by another relay after the snapshot is checked again on
// its latest version (no longer pending), so concurrent claims partition
// the due messages. The lease runs from the server's clock as the claim
// runs.
const claimSQL = `
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS n),
due AS (
	SELECT o.id
	FROM {table} o, now
	WHERE o.status = 'pending' AND o.next_attempt_at <= now.n
		AND NOT EXISTS (
			SELECT FROM {table} e
			WHERE e.ordering_key = o.ordering_key AND e.id < o.id
				AND e.status IN ('pending', 'claimed'))
	ORDER BY o.next_attempt_at, o.id
	LIMIT $1::integer
	FOR UPDATE OF o SKIP LOCKED
)
UPDATE {table} o SET
	status = 'claimed', claim_token = $2::text, claimed_by = $3::text, claim_until = now.n + $4::interval
FROM due, now
WHERE o.id = due.id
RETURNING o.id, o.storage_key, o.seq, o.topic, o.payload, o.headers, o.ordering_key, o.attempts, o.enqueued_at`

// doneSQL marks the messages of a claim that its sink confirmed
// published, in one statement (one commit) per batch, and returns the ids
// it marked: $1 ids, $2 the claim's token. An id it does not return was
// taken back meanwhile (fenced).
const doneSQL = `
UPDATE {table} SET
	status = 'done', attempts = attempts + 1, finished_at = clock_timestamp(),
	claim_token = NULL, claim_until = NULL
WHERE id = ANY ($1::bigint[]) AND status = 'claimed' AND claim_token = $2::text
RETURNING id`

// retrySQL records a failed publish: back to pending, due after the
// backoff, or dead when this was attempt $3 (the cap) or later; the error
// is kept either way. It returns the status it set.
//
//	$1 id, $2 the claim's token, $3 the attempt cap, $4 backoff, $5 error
const retrySQL = `
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS n)
UPDATE {table} o SET
	attempts = o.attempts + 1,
	status = CASE WHEN o.attempts + 1 >= $3::integer THEN 'dead' ELSE 'pending' END,
	next_attempt_at = now.n + $4::interval,
	finished_at = CASE WHEN o.attempts + 1 >= $3::integer THEN now.n END,
	last_error = $5::text,
	claim_token = NULL, claim_until = NULL
FROM now
WHERE o.id = $1::bigint AND o.status = 'claimed' AND o.claim_token = $2::text
RETURNING o.status`

// releaseSQL hands back messages of a claim that were never presented (the
// relay stopped, or too little of the lease was left): pending again, due
// as they were, no attempt counted.
//
//	$1 ids, $2 the claim's token
const releaseSQL = `
UPDATE {table} SET status = 'pending', claim_token = NULL, claim_until = NULL
WHERE id = ANY ($1::bigint[]) AND status = 'claimed' AND claim_token = $2::text`

// reclaimSQL takes back the claims whose lease ran out before their relay
// marked an outcome (it died, stalled, or lost the database): each counts
// as an attempt (the message may have been published), so a message that
// kills every relay that presents it goes dead at the cap ($1) instead of
// looping. The others are pending again, due at once. It returns each
// row's new status, ID, topic and attempts.
const reclaimSQL = `
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS n)
UPDATE {table} o SET
	attempts = o.attempts + 1,
	status = CASE WHEN o.attempts + 1 >= $1::integer THEN 'dead' ELSE 'pending' END,
	next_attempt_at = now.n,
	finished_at = CASE WHEN o.attempts + 1 >= $1::integer THEN now.n END,
	last_error = 'claim_expired: the claim of ' || coalesce(o.claimed_by, 'a relay') || ' ran out before it marked an outcome',
	claim_token = NULL, claim_until = NULL
FROM now
WHERE o.status = 'claimed' AND o.claim_until <= now.n
RETURNING o.status, o.storage_key, o.seq, o.topic, o.attempts`

// stateSQL reads what the relay's idle loop needs, in seconds from the
// server's clock: the lag (how long the earliest due pending message has
// been due, 0 when none is), the time until the next pending message falls
// due, and until the next claim runs out (NULL when there is none).
const stateSQL = `
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS n)
SELECT
	coalesce(extract(epoch FROM now.n - (
		SELECT min(next_attempt_at) FROM {table} WHERE status = 'pending' AND next_attempt_at <= now.n)), 0)::float8,
	extract(epoch FROM (
		SELECT min(next_attempt_at) FROM {table} WHERE status = 'pending' AND next_attempt_at > now.n) - now.n)::float8,
	extract(epoch FROM (SELECT min(claim_until) FROM {table} WHERE status = 'claimed') - now.n)::float8
FROM now`

// purgeSQL deletes at most $2 messages that have been done or dead for
// longer than the retention $1, oldest first; pending and claimed messages
// never. SKIP LOCKED leaves the rows another relay's purge holds.
const purgeSQL = `
DELETE FROM {table}
WHERE id = ANY (ARRAY(
	SELECT id FROM {table}
	WHERE status IN ('done', 'dead') AND finished_at <= clock_timestamp() - $1::interval
	ORDER BY finished_at
	LIMIT $2::integer
	FOR UPDATE SKIP LOCKED
))`

// statements holds the statements for one table.
type statements struct {
	claim, done, retry, release, reclaim, state, purge string
}

func newStatements(t pgname.Table) statements {
	put := strings.NewReplacer("{table}", t.Quoted()).Replace
	return statements{
		claim:   put(claimSQL),
		done:    put(doneSQL),
		retry:   put(retrySQL),
		release: put(releaseSQL),
		reclaim: put(reclaimSQL),
		state:   put(stateSQL),
		purge:   put(purgeSQL),
	}
}
