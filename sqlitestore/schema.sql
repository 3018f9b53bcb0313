-- The table of sqlitestore under its default name (sqlitestore.DefaultTable)
-- and its index. sqlitestore.Open runs it on every start; Schema(name) gives
-- it for another table name. Both statements are idempotent (IF NOT EXISTS).
--
-- One row per record. Times are INTEGER unix microseconds from the Store's
-- clock (WithClock; time.Now by default).
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
--   status        the response's status (complete only)
--   headers       the response's status, flags and headers in the binary
--                 block redisstore, memstore and pgstore store (complete only)
--   body          the response body, raw; empty when omitted (complete only)
--   body_omitted  1 when the body was not stored (complete only)
--   updated_at    when an edge last wrote the row
--
-- A table with a rowid, not WITHOUT ROWID: a row holds a response body of up
-- to the middleware's cap (1 MiB by default), and SQLite keeps large rows
-- better in a rowid table than in the primary key's b-tree.
CREATE TABLE IF NOT EXISTS "idempotency_records" (
	key          TEXT    NOT NULL PRIMARY KEY,
	state        TEXT    NOT NULL CHECK (state IN ('in_progress', 'complete')),
	token        TEXT    NOT NULL,
	fingerprint  BLOB    NOT NULL,
	epoch        INTEGER NOT NULL CHECK (epoch >= 1),
	lease_until  INTEGER NOT NULL,
	ttl_until    INTEGER NOT NULL,
	expires_at   INTEGER NOT NULL,
	status       INTEGER,
	headers      BLOB,
	body         BLOB,
	body_omitted INTEGER,
	updated_at   INTEGER NOT NULL
);

-- Purge walks this index from its oldest entry, so a batch costs the rows
-- it deletes, however many live records the table holds.
CREATE INDEX IF NOT EXISTS "idempotency_records_expires_at_idx"
	ON "idempotency_records" (expires_at);
