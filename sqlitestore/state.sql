-- The state records' tables under their default names (DefaultStateTable and
-- its history, "<table>_history"): the records of package state, moved by
-- compare-and-swap transitions whose events the transaction writes into the
-- outbox. sqlitestore.Open runs it; StateSchema(name) gives it for another
-- table name. Every statement is idempotent (IF NOT EXISTS).
--
-- The columns are those of PostgreSQL's (pgstore/state.sql); data and cause
-- are JSON text, times INTEGER unix microseconds.
CREATE TABLE IF NOT EXISTS "idempotency_state" (
	scope      TEXT    NOT NULL,
	machine    TEXT    NOT NULL,
	id         TEXT    NOT NULL,
	state      TEXT    NOT NULL,
	version    INTEGER NOT NULL,
	data       TEXT    NOT NULL,
	created_at INTEGER NOT NULL,
	updated_at INTEGER NOT NULL,
	PRIMARY KEY (scope, machine, id),
	CHECK (version >= 1)
);

CREATE TABLE IF NOT EXISTS "idempotency_state_history" (
	key        TEXT    NOT NULL,
	version    INTEGER NOT NULL,
	from_state TEXT    NOT NULL,
	to_state   TEXT    NOT NULL,
	cause      TEXT    NOT NULL,
	at         INTEGER NOT NULL,
	PRIMARY KEY (key, version),
	CHECK (version >= 2)
);
