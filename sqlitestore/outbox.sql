-- The outbox under its default name (sqlitestore.DefaultOutboxTable) and its
-- indexes: the messages that handlers on transactional routes enqueue
-- (package outbox), committed with the record, and that a relay
-- (Store.Relay) publishes. sqlitestore.Open runs it; OutboxSchema(name)
-- gives it for another table name. Every statement is idempotent (IF NOT
-- EXISTS).
--
-- The columns are those of PostgreSQL's outbox (pgstore/outbox.sql, which
-- says what each holds), and package outbox/lifecycle owns every statement
-- on the table, in its SQLite dialect. Times are INTEGER unix microseconds
-- from the clock of the process that runs the statement (SQLite's
-- unixepoch('subsec')), but for a message's NotBefore; headers is JSON
-- text. AUTOINCREMENT keeps the ids of purged messages from being used
-- again: a relay's marks name messages by id.
CREATE TABLE IF NOT EXISTS "idempotency_outbox" (
	id               INTEGER PRIMARY KEY AUTOINCREMENT,
	storage_key      TEXT    NOT NULL,
	seq              INTEGER NOT NULL,
	topic            TEXT    NOT NULL,
	payload          BLOB    NOT NULL,
	headers          TEXT    NOT NULL,
	ordering_key     TEXT    NOT NULL,
	status           TEXT    NOT NULL DEFAULT 'ready',
	attempts         INTEGER NOT NULL DEFAULT 0,
	enqueued_at      INTEGER NOT NULL,
	due_at           INTEGER NOT NULL,
	claim_token      TEXT,
	claimed_by       TEXT,
	claim_until      INTEGER,
	finished_at      INTEGER,
	last_error       TEXT,
	suspended_reason TEXT,
	requeues         INTEGER NOT NULL DEFAULT 0,
	requeued_at      INTEGER,
	requeued_by      TEXT,
	UNIQUE (storage_key, seq),
	CHECK (status IN ('scheduled', 'ready', 'claimed', 'retry_wait', 'suspended', 'done', 'dead', 'canceled')),
	CHECK (seq >= 1 AND attempts >= 0 AND requeues >= 0),
	CHECK ((status = 'claimed') = (claim_token IS NOT NULL AND claim_until IS NOT NULL))
);

CREATE INDEX IF NOT EXISTS "idempotency_outbox_due_idx"
	ON "idempotency_outbox" (due_at, id) WHERE status IN ('scheduled', 'ready', 'retry_wait');

CREATE INDEX IF NOT EXISTS "idempotency_outbox_order_idx"
	ON "idempotency_outbox" (ordering_key, id) WHERE status IN ('scheduled', 'ready', 'claimed', 'retry_wait', 'suspended');

CREATE INDEX IF NOT EXISTS "idempotency_outbox_claim_idx"
	ON "idempotency_outbox" (claim_until) WHERE status = 'claimed';

CREATE INDEX IF NOT EXISTS "idempotency_outbox_finished_idx"
	ON "idempotency_outbox" (finished_at) WHERE status IN ('done', 'dead', 'canceled');
