-- The table of pgstore under its default name (pgstore.DefaultTable). Run
-- the file as it is with psql, or take it from pgstore.Schema(name) with
-- another table name; pgstore.Migrate runs it under an advisory lock. Every
-- statement is idempotent (IF NOT EXISTS).
--
-- One row per record. The times come from the server's clock
-- (clock_timestamp()), never from an application's.
--
--   key           the storage key (the hex SHA-256 the middleware derives)
--   state         'in_progress' or 'complete'
--   token         lease token of the holder (of the completer, once complete)
--   fingerprint   the request's fingerprint, compared byte for byte
--   epoch         1 for the first lease, +1 for each steal
--   lease_until   when the holder's lease ends (read while in_progress)
--   ttl_until     the TTL deadline: from the acquire (in_progress) or from
--                 the completion (complete)
--   expires_at    when the record is gone: ttl_until once complete, the
--                 later of ttl_until and lease_until while in_progress; a
--                 record is absent from that instant, purged or not
--   watched       a waiter watches the record: complete and release notify
--   status        the response's status (complete only)
--   headers       the response's status, flags and headers in the binary
--                 block redisstore and memstore store (complete only)
--   body          the response body, raw; empty when omitted (complete only)
--   body_omitted  the body was not stored (complete only)
--   updated_at    when the row was last written
CREATE TABLE IF NOT EXISTS "idempotency_records" (
	key          text        NOT NULL,
	state        text        NOT NULL,
	token        text        NOT NULL,
	fingerprint  bytea       NOT NULL,
	epoch        bigint      NOT NULL,
	lease_until  timestamptz NOT NULL,
	ttl_until    timestamptz NOT NULL,
	expires_at   timestamptz GENERATED ALWAYS AS (
		CASE state
			WHEN 'complete' THEN ttl_until
			WHEN 'in_progress' THEN greatest(ttl_until, lease_until)
		END
	) STORED,
	watched      boolean     NOT NULL DEFAULT false,
	status       integer,
	headers      bytea,
	body         bytea,
	body_omitted boolean,
	updated_at   timestamptz NOT NULL,
	PRIMARY KEY (key),
	CHECK (state IN ('in_progress', 'complete')),
	CHECK (epoch >= 1)
);

-- Purge walks this index from its oldest entry, so a batch costs the rows
-- it deletes, however many live records the table holds.
CREATE INDEX IF NOT EXISTS "idempotency_records_expires_at_idx"
	ON "idempotency_records" (expires_at);
