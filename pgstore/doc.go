// Package pgstore is an idempotency.Store that keeps records in a
// PostgreSQL table, through a pgx connection pool (pgxpool). It is also an
// idempotency.TxStore: on routes with idempotency.WithTransaction, the
// handler's own writes and the key's COMPLETE record commit in one
// transaction, so a database side effect happens exactly once.
//
//	pool, err := pgxpool.New(ctx, "postgres://app@db.internal/app")
//	...
//	if err := pgstore.Migrate(ctx, pool); err != nil { ... }
//	store := pgstore.New(pool)
//	defer store.Close()
//	mw := idempotency.New(store)
//
// # Records
//
// One row per record, in the table set by WithTable (DefaultTable by
// default), which Migrate creates, or the SQL of Schema (the embedded
// schema.sql) for teams that run their own migrations, with a PL/pgSQL
// function named after the table ("idempotency_records_acquire") that
// holds the acquire's write (see below). The row holds the
// record's state, the holder's lease token, the request's fingerprint, the
// epoch, the lease and TTL deadlines, and, once COMPLETE, the response:
// status, headers (the binary block that redisstore and memstore use),
// body and whether the body was omitted. A generated column, expires_at,
// holds the instant the record is gone: its TTL deadline once COMPLETE,
// the later of its TTL deadline and its lease while IN_PROGRESS.
//
// Every deadline is computed and judged on the server's clock
// (clock_timestamp(), read once per statement); the store sends durations,
// never times, so the clocks of application nodes do not matter.
//
// A row whose payload cannot be read (a headers block that does not
// decode, a status or body_omitted that disagrees with it, a missing
// column) or whose state is unknown is reported as an error wrapping
// idempotency.ErrCorruptRecord, and left as it is.
//
// # Statements and round trips
//
// Every edge (acquire and steal, complete, release, extend) is one SQL
// statement, sent as one query and run as one implicit transaction (see
// the statements' comments in sql.go for why each is correct under
// concurrency). A replay costs one round trip (the acquire's reply carries
// the payload); a first execution two (acquire, complete), as on Redis.
// The acquire statement is a SELECT of the row by primary key, which calls
// the acquire function, and so writes, only when the record must be made
// or change: a replay, a mismatch and a duplicate of a watched record in
// flight cost what a read costs (no row lock, no write, no transaction
// id, no WAL flush at commit). A
// call that races another call on the same key may run its statement a
// second time (see below). Two properties of pgx add to these counts:
// pgx prepares a statement the first time a connection runs it (one more
// round trip, once per connection), and pgxpool pings a connection that
// sat idle for more than a second before handing it out (its ShouldPing
// setting).
//
// # Concurrency
//
// The statements assume READ COMMITTED, the server's default. Each changes
// the row with one command (INSERT ... ON CONFLICT DO UPDATE in the
// acquire function, UPDATE or DELETE) whose WHERE clause is the whole
// condition of the edge; such a command waits for a concurrent
// transaction that holds the row and judges the row's latest version,
// under its lock. So two edges on one key are ordered by the row lock, and
// each sees the other's result.
//
// When the command changes nothing, the statement reads the row to say
// why (COMPLETE, lease lost, absent); the acquire statement reads it
// first, and answers from it when it settles the answer (a replay,
// another fingerprint, a watched record in flight), true at the instant
// its snapshot was taken. That read sees the statement's snapshot, which
// may predate a transaction that the command waited for; when the read
// contradicts the command, the statement answers so and the store runs it
// again, with a snapshot that includes that transaction. At REPEATABLE
// READ or SERIALIZABLE as the server's
// default, a statement that fails with a serialization error is run again
// too.
//
// # Waiting
//
// Waiters are woken by LISTEN/NOTIFY: the complete and release statements
// call pg_notify on the Store's channel (WithChannel) with the record's key
// as payload, delivered when their transaction commits. PostgreSQL
// serializes the commits of all notifying transactions of a database, so
// only records someone waits for notify: Watch marks the record (its
// watched column), and so does an acquire that finds the record in flight,
// since a waiter may have registered before the record existed. All
// waiters of a Store share one listening connection, which a health check
// replaces when it dies (WithListenerHealthCheck); a waiter also re-checks
// when the holder's lease runs out, so a lost notification costs latency,
// never correctness. See Store.Watch.
//
// # Transactional completion
//
// With idempotency.WithTransaction, the middleware calls BeginTx once it
// holds the lease, and hands the transaction to the handler, which writes
// through it:
//
//	tx, _ := pgstore.TxFromContext(r.Context())
//	_, err := tx.Exec(r.Context(), `INSERT INTO payments (id, amount) VALUES ($1, $2)`, id, amount)
//
// After the handler, Tx.Complete runs the complete statement inside that
// transaction, and commits; the client gets the response after the
// commit. The statement is the fence:
//
//	UPDATE records SET state = 'complete', ...
//	WHERE key = $1 AND token = $2 AND state = 'in_progress' AND <not expired>
//
// It updates the row only while the record is still IN_PROGRESS under the
// lease token the request acquired with. When it updates nothing (a
// duplicate stole the record after this request's lease ran out, and
// perhaps completed it), the transaction rolls back, the handler's writes
// with it, and the middleware answers 503 lease_lost. When it updates the
// row, the row stays locked until the COMMIT: a concurrent steal, which is
// an update of the same row, waits for the COMMIT and then finds the
// record COMPLETE, and replays it. Either the fence or the steal locks the
// row first; whichever does, only one attempt's writes commit.
//
// A third-party SQL store gets the same guarantee the same way: keep the
// record in a row that every edge changes with a single conditional
// UPDATE, DELETE or INSERT ... ON CONFLICT (so each edge takes the row
// lock and judges the latest version), and complete it inside the
// handler's transaction with an UPDATE conditioned on the lease token and
// the IN_PROGRESS state, rolling back when it updates no row. Do not read
// the record first and decide in the application: the row lock of the
// fencing UPDATE is what orders it against a steal.
//
// Handlers must not commit the transaction (its Commit returns
// ErrHandlerCommit); to abandon their writes they answer with a status
// that releases the key (a 5xx by default) or panic. The transaction holds
// a pool connection while the handler runs. Keep its isolation level at
// READ COMMITTED (see WithTxOptions).
//
// # Purge
//
// An expired record is absent to every call from the instant it expires,
// whether or not its row is still there. Purge deletes expired rows in
// bounded batches along an index on expires_at: call it from a job of your
// own, or let the Store run it (WithPurgeInterval).
package pgstore
