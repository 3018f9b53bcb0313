-- The outbox under its default name (pgstore.DefaultOutboxTable) and its
-- indexes: the messages that handlers on transactional routes enqueue
-- (package outbox), committed with the record, and that a relay (package
-- outbox/relay) publishes. pgstore.Schema appends this file to schema.sql
-- and pgstore.Migrate runs both; pgstore.OutboxSchema(name) gives it for
-- another table name. Every statement is idempotent (IF NOT EXISTS).
--
-- One row per message. The times come from the server's clock
-- (clock_timestamp()), never from an application's.
--
--   id               the enqueue order: ascending within a record, and
--                    among the messages of one ordering key in the order
--                    their transactions committed
--   storage_key      the storage key of the record that enqueued it
--   seq              its place among the record's messages, from 1; the
--                    message's ID is storage_key || '/' || seq
--   topic            the subject or routing key
--   payload          the body, raw
--   headers          a JSON object of strings
--   ordering_key     messages of one key are published in id order (the
--                    storage key unless the handler gave one)
--   status           pending, claimed, done or dead
--   attempts         presentations to the sink that counted: published,
--                    failed, or a claim that ran out before an outcome
--   enqueued_at      when the handler enqueued it
--   next_attempt_at  when a pending message is due
--   claim_token      the claim that holds it (claimed only): the fence of
--                    the relay's marks
--   claimed_by       the relay that claimed it last
--   claim_until      when the claim runs out and another relay may take
--                    the message back (claimed only)
--   finished_at      when it was done or went dead
--   last_error       why the last attempt failed: "<code>: <message>"
CREATE TABLE IF NOT EXISTS "idempotency_outbox" (
	id              bigint      GENERATED ALWAYS AS IDENTITY,
	storage_key     text        NOT NULL,
	seq             integer     NOT NULL,
	topic           text        NOT NULL,
	payload         bytea       NOT NULL,
	headers         jsonb       NOT NULL,
	ordering_key    text        NOT NULL,
	status          text        NOT NULL DEFAULT 'pending',
	attempts        integer     NOT NULL DEFAULT 0,
	enqueued_at     timestamptz NOT NULL,
	next_attempt_at timestamptz NOT NULL,
	claim_token     text,
	claimed_by      text,
	claim_until     timestamptz,
	finished_at     timestamptz,
	last_error      text,
	PRIMARY KEY (id),
	UNIQUE (storage_key, seq),
	CHECK (status IN ('pending', 'claimed', 'done', 'dead')),
	CHECK (seq >= 1 AND attempts >= 0),
	CHECK ((status = 'claimed') = (claim_token IS NOT NULL AND claim_until IS NOT NULL))
);

-- The claim walks the pending messages from the earliest due; so do the
-- relay's lag (the oldest due message) and its next wake-up (the next
-- retry).
CREATE INDEX IF NOT EXISTS "idempotency_outbox_due_idx"
	ON "idempotency_outbox" (next_attempt_at, id) WHERE status = 'pending';

-- A message is presented only when no earlier one of its ordering key is
-- pending or claimed: the claim looks here.
CREATE INDEX IF NOT EXISTS "idempotency_outbox_order_idx"
	ON "idempotency_outbox" (ordering_key, id) WHERE status IN ('pending', 'claimed');

-- Claims that ran out are taken back from here.
CREATE INDEX IF NOT EXISTS "idempotency_outbox_claim_idx"
	ON "idempotency_outbox" (claim_until) WHERE status = 'claimed';

-- The purge deletes terminal messages from the oldest.
CREATE INDEX IF NOT EXISTS "idempotency_outbox_finished_idx"
	ON "idempotency_outbox" (finished_at) WHERE status IN ('done', 'dead');
