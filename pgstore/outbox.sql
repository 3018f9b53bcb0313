-- The outbox under its default name (pgstore.DefaultOutboxTable) and its
-- indexes: the messages that handlers on transactional routes enqueue
-- (package outbox), committed with the record, and that a relay (package
-- outbox/relay) publishes. pgstore.Schema appends this file to schema.sql
-- and pgstore.Migrate runs both; pgstore.OutboxSchema(name) gives it for
-- another table name. Every statement is idempotent (IF NOT EXISTS).
--
-- One row per message: a durable run, whose states and edges package
-- outbox/lifecycle owns (its documentation has the table); every statement
-- on this table but these is there. The times come from the server's
-- clock (clock_timestamp()), never from an application's, but for a
-- message's NotBefore.
--
--   id                the enqueue order: ascending within a record, and
--                     among the messages of one ordering key in the order
--                     their transactions committed
--   storage_key       the storage key of the record that enqueued it
--   seq               its place among the record's messages, from 1; the
--                     message's ID is storage_key || '/' || seq
--   topic             the subject or routing key
--   payload           the body, raw
--   headers           a JSON object of strings
--   ordering_key      messages of one key are presented in id order, one
--                     at a time (the storage key unless the handler gave
--                     one)
--   status            scheduled, ready, claimed, retry_wait, suspended
--                     (not finished); done, dead, canceled (finished)
--   attempts          presentations to the sink that counted: published,
--                     failed, refused, unreadable, or a claim that ran out
--                     before an outcome (a suspension does not count)
--   enqueued_at       when the handler enqueued it
--   due_at            when it falls due: scheduled, ready and retry_wait
--                     messages are claimed once it has passed
--   claim_token       the claim that holds it (claimed only): the fence of
--                     the relay's marks
--   claimed_by        the relay that claimed it last
--   claim_until       when the claim runs out and another relay may take
--                     the message back (claimed only)
--   finished_at       when it was done, went dead or was canceled
--   last_error        why the last attempt failed, or why it was canceled:
--                     "<code>: <message>"
--   suspended_reason  why it is suspended (suspended only)
--   requeues          how many times an operator requeued it
--   requeued_at       when it was last requeued
--   requeued_by       who requeued it last
--
-- A message's row is written three times: by its enqueue, its claim and
-- its done mark. The two updates change the status, which the partial
-- indexes below name, so neither can be a heap-only (HOT) update; a
-- fillfactor of 50 leaves room on the page for the row's new versions
-- (the pruning of the old ones keeps making room), so that an update
-- writes one heap page rather than two, and less WAL: about 1.1 KB per
-- message published against 1.5 KB at the default of 100 (see
-- benchmarks/outboxbench).
CREATE TABLE IF NOT EXISTS "idempotency_outbox" (
	id               bigint      GENERATED ALWAYS AS IDENTITY,
	storage_key      text        NOT NULL,
	seq              integer     NOT NULL,
	topic            text        NOT NULL,
	payload          bytea       NOT NULL,
	headers          jsonb       NOT NULL,
	ordering_key     text        NOT NULL,
	status           text        NOT NULL DEFAULT 'ready',
	attempts         integer     NOT NULL DEFAULT 0,
	enqueued_at      timestamptz NOT NULL,
	due_at           timestamptz NOT NULL,
	claim_token      text,
	claimed_by       text,
	claim_until      timestamptz,
	finished_at      timestamptz,
	last_error       text,
	suspended_reason text,
	requeues         integer     NOT NULL DEFAULT 0,
	requeued_at      timestamptz,
	requeued_by      text,
	PRIMARY KEY (id),
	UNIQUE (storage_key, seq),
	CHECK (status IN ('scheduled', 'ready', 'claimed', 'retry_wait', 'suspended', 'done', 'dead', 'canceled')),
	CHECK (seq >= 1 AND attempts >= 0 AND requeues >= 0),
	CHECK ((status = 'claimed') = (claim_token IS NOT NULL AND claim_until IS NOT NULL))
) WITH (fillfactor = 50);

-- The claim walks the claimable messages from the earliest due; so do the
-- relay's lag (the oldest due message) and its next wake-up (the next
-- message to fall due).
CREATE INDEX IF NOT EXISTS "idempotency_outbox_due_idx"
	ON "idempotency_outbox" (due_at, id) WHERE status IN ('scheduled', 'ready', 'retry_wait');

-- A message is claimed only when no earlier one of its ordering key is
-- not finished: the claim looks here.
CREATE INDEX IF NOT EXISTS "idempotency_outbox_order_idx"
	ON "idempotency_outbox" (ordering_key, id) WHERE status IN ('scheduled', 'ready', 'claimed', 'retry_wait', 'suspended');

-- Claims that ran out are taken back from here.
CREATE INDEX IF NOT EXISTS "idempotency_outbox_claim_idx"
	ON "idempotency_outbox" (claim_until) WHERE status = 'claimed';

-- The purge deletes finished messages from the oldest.
CREATE INDEX IF NOT EXISTS "idempotency_outbox_finished_idx"
	ON "idempotency_outbox" (finished_at) WHERE status IN ('done', 'dead', 'canceled');
