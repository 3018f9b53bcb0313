package outbox

// enqueueSQL writes the messages of one Enqueue call.
//
//	$1 storage key, $2 topics, $3 payloads, $4 headers (JSON objects),
//	$5 ordering keys ("" for the storage key), $6 channel
//
// The sequence continues past the highest one of the storage key that the
// statement's snapshot holds: the transaction's own messages, and those of
// earlier records with the key that committed. Two attempts at one record
// see the same committed rows (only one attempt ever commits), so they
// number their messages alike; the second to insert a number waits on the
// unique index for the first's transaction, and goes on once it rolled
// back (or fails, once it committed). The rows are inserted in the order
// of the arrays, so that their ids ascend with their sequence.
//
// pg_notify is delivered when the transaction commits, once per
// transaction however many statements send it.
const enqueueSQL = `
WITH now AS MATERIALIZED (SELECT clock_timestamp() AS n),
base AS (SELECT coalesce(max(seq), 0) AS n FROM {table} WHERE storage_key = $1::text),
added AS (
	INSERT INTO {table} (storage_key, seq, topic, payload, headers, ordering_key, enqueued_at, next_attempt_at)
	SELECT $1::text, (base.n + m.i)::integer, m.topic, m.payload, m.headers::jsonb,
		coalesce(nullif(m.ordering_key, ''), $1::text), now.n, now.n
	FROM base, now,
		unnest($2::text[], $3::bytea[], $4::text[], $5::text[]) WITH ORDINALITY AS m(topic, payload, headers, ordering_key, i)
	ORDER BY m.i
	RETURNING seq
),
notified AS (SELECT pg_notify($6::text, ''))
SELECT (SELECT min(seq) FROM added), (SELECT count(*) FROM added), (SELECT count(*) FROM notified)`

// lockSQL takes a transaction-level advisory lock on each ordering key a
// handler gave, in sorted order, so that the transactions enqueueing on
// one key commit one after the other, in the order of their ids. It runs
// as a statement of its own before enqueueSQL, so that the latter's
// snapshot, taken after the locks, sees what the previous holder
// committed.
//
//	$1 table name, $2 ordering keys, sorted, once each
const lockSQL = `
SELECT count(pg_advisory_xact_lock(hashtextextended('outbox:' || $1::text || ':' || k, 0)))
FROM (SELECT k FROM unnest($2::text[]) AS k ORDER BY k) AS keys`
