-- The table of pgstore under its default name (pgstore.DefaultTable), its
-- index and the function its acquire statement calls to write. Run the file
-- as it is with psql, or take it from pgstore.Schema(name) with another
-- table name; pgstore.Migrate runs it under an advisory lock. Every
-- statement is idempotent (IF NOT EXISTS, OR REPLACE): run it again after
-- an upgrade of pgstore.
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

-- The write of pgstore's acquire statement, which calls it only when the
-- version of the row that the statement read from its snapshot needs a
-- change: no record, an expired one, a lease that has run out, the
-- holder's own retry, or a record in flight not yet watched (see acquireSQL
-- in pgstore's sql.go). A replay, a mismatch and a watched record in flight
-- never call it, so they are answered by a plain SELECT.
--
-- It proposes a fresh record (epoch 1, lease and TTL from n, the instant
-- the statement read from the server's clock). When the key exists, ON
-- CONFLICT DO UPDATE locks the row's latest version, r, and changes it
-- only when r is expired, or in progress with the same fingerprint and
-- either held by p_token, past its lease, or not yet watched (then only
-- watched is set). It returns {code, epoch, lease left in microseconds} of
-- the version it wrote: code 1 when p_token holds the record, 4 when
-- another token does (the record was marked watched); or {0, 0, 0} when it
-- changed nothing (r differs from the version the statement read: the
-- caller runs the statement again). CREATE OR REPLACE keeps the
-- function's parameters and result type: a version of pgstore that changes
-- them drops the function first.
CREATE OR REPLACE FUNCTION "idempotency_records_acquire"(
	p_key text, p_token text, p_fingerprint bytea, p_lease interval, p_ttl interval, n timestamptz)
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
	w_token text;
	w_epoch bigint;
	w_lease timestamptz;
BEGIN
	INSERT INTO "idempotency_records" AS r
		(key, state, token, fingerprint, epoch, lease_until, ttl_until, updated_at)
	VALUES (p_key, 'in_progress', p_token, p_fingerprint, 1, n + p_lease, n + p_ttl, n)
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
	RETURNING r.token, r.epoch, r.lease_until INTO w_token, w_epoch, w_lease;
	IF NOT FOUND THEN
		RETURN ARRAY[0, 0, 0]::bigint[];
	END IF;
	RETURN ARRAY[
		CASE WHEN w_token = p_token THEN 1 ELSE 4 END,
		w_epoch,
		ceil(extract(epoch FROM w_lease - n) * 1000000)
	]::bigint[];
END
$fn$;
