-- The state records under their default name (pgstore.DefaultStateTable)
-- and their history: the records of package state, each a state, a
-- version and JSON data that transitions move by compare-and-swap, each
-- transition an event in the outbox (outbox.sql) and a row of the history,
-- written by the same statement. pgstore.Schema appends this file to
-- schema.sql and outbox.sql and pgstore.Migrate runs them all;
-- pgstore.StateSchema(name) gives it for another table name (the history
-- is named after it, with "_history" appended). Every statement is
-- idempotent (IF NOT EXISTS). Package state holds every statement on these
-- tables. The times come from the server's clock (clock_timestamp()).
--
-- One row per record, named by (scope, machine, id):
--
--   scope       the tenant the record belongs to
--   machine     the family of records, a lowercase dotted name
--   id          the record's name within the machine
--   state       the state, a short token
--   version     1 at the creation, + 1 for each transition
--   data        the caller's JSON, kept as it was given (json, not jsonb,
--               so that every valid JSON text is kept byte for byte)
--   created_at  when the record was created
--   updated_at  when it last moved (created_at until then)
CREATE TABLE IF NOT EXISTS "idempotency_state" (
	scope      text        NOT NULL,
	machine    text        NOT NULL,
	id         text        NOT NULL,
	state      text        NOT NULL,
	version    bigint      NOT NULL,
	data       json        NOT NULL,
	created_at timestamptz NOT NULL,
	updated_at timestamptz NOT NULL,
	PRIMARY KEY (scope, machine, id),
	CHECK (version >= 1)
);

-- One row per transition, kept for as long as its record (the outbox
-- purges a delivered event after the relays' retention; its history row
-- stays). Creation is not a transition and has no row.
--
--   key         the hash of (scope, machine, id) that names the record's
--               events in the outbox: the storage key of their IDs,
--               "<key>/<version>"
--   version     the version the transition made
--   from_state  the state it moved from
--   to_state    the state it moved to
--   cause       a JSON object: the idempotency key, storage key and epoch
--               of the request or call that committed it, and its trace
--               context, each when there was one
--   at          when it committed (the server's clock at its statement)
CREATE TABLE IF NOT EXISTS "idempotency_state_history" (
	key        text        NOT NULL,
	version    bigint      NOT NULL,
	from_state text        NOT NULL,
	to_state   text        NOT NULL,
	cause      json        NOT NULL,
	at         timestamptz NOT NULL,
	PRIMARY KEY (key, version),
	CHECK (version >= 2)
);
