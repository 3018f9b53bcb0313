// Package sqlitestore is a durable, embedded idempotency.Store that keeps
// records in a table of an SQLite file, through modernc.org/sqlite (pure
// Go, no cgo). It is also an idempotency.TxStore: on routes with
// idempotency.WithTransaction, the handler's own writes to the same file
// and the key's COMPLETE record commit in one transaction, so a database
// side effect happens exactly once.
//
//	store, err := sqlitestore.Open("/var/lib/app/app.db")
//	...
//	defer store.Close()
//	mw := idempotency.New(store)
//
// # Settings
//
// Open opens every connection to the file with journal_mode=WAL (readers
// never wait for the writer, nor it for them), synchronous=FULL,
// foreign_keys=ON, a busy timeout (WithBusyTimeout, 5s by default) and
// BEGIN IMMEDIATE for every transaction, so a writer takes the file's write
// lock before it reads: writers are serialized, and what a writer read
// stays true until its COMMIT. The Store's own writes run on a connection
// it keeps for them, with BEGIN IMMEDIATE and COMMIT prepared once, and the
// transactions of transactional requests run on it too. It creates the
// records' table when it does not exist (see Schema), and checks the file:
// it refuses, with an error naming the cause, a file it cannot write
// (PRAGMA query_only, a read-only file or connection, a directory where
// SQLite cannot create the -wal and -shm files), a journal that is not in
// WAL mode (a filesystem without shared memory), and a table of that name
// with other columns. Store.Check runs the same checks again. CheckFile
// judges a file from outside the application (from a deployment pipeline,
// or idemctl check -sqlite), item by item, in the Report of package
// servercheck/report: it never creates the file and writes nothing to the
// database.
//
// # Records
//
// One row per record, with its state, the holder's lease token, the
// request's fingerprint, the epoch, the lease and TTL deadlines, the
// instant the record expires (indexed, for Purge), and, once COMPLETE, the
// response: status, headers (the binary block that redisstore, memstore
// and pgstore use), body and whether the body was omitted. Every time is
// an INTEGER of unix microseconds, computed in Go from the Store's clock
// (WithClock; time.Now by default). On one machine every process reads the
// same clock, so processes sharing the file agree on every lease.
//
// A replay, a mismatch and a duplicate in flight are answered by one read
// of the row outside any transaction. A key that read no row gets its
// record from one INSERT that writes nothing when a row appeared since.
// Every other edge (acquire over a row, steal, a holder's retry, complete,
// release, extend, purge) is a BEGIN IMMEDIATE
// transaction that reads the row again under the write lock, decides in
// Go, and writes with one statement whose WHERE clause repeats the
// condition. A row that is not a record (a headers block that does not
// decode, a status or body_omitted that disagrees with it, an unknown
// state, a NULL or a value of another type where a record has a value) is
// reported as an error wrapping idempotency.ErrCorruptRecord, and left as
// it is.
//
// # One process or several
//
// The Store's writers take turns in the Store before they begin, rather
// than in SQLite's busy handler, which sleeps and polls: the next writer
// starts the moment the previous one commits, and its wait ends with its
// context. Writers of other processes, and the application's own
// transactions on DB, wait for the write lock up to the busy timeout.
//
// By default one process owns the file: waiters (idempotency.WithWait) are
// woken by the Store's own completes and releases, in process. When
// several processes share the file, give each Store WithPollInterval: a
// waiter is then also woken by a poll of its record, one query per interval
// for all of a Store's waiters. Either way a waiter re-checks when the
// holder's lease runs out, so a missed notification costs latency, never
// correctness.
//
// # Transactional completion
//
// With idempotency.WithTransaction, the middleware calls BeginTx once it
// holds the lease, and hands the transaction to the handler, which writes
// through it:
//
//	tx, _ := sqlitestore.TxFromContext(r.Context())
//	_, err := tx.ExecContext(r.Context(), `INSERT INTO payments (id, amount) VALUES (?, ?)`, id, amount)
//
// After the handler, Tx.Complete runs the fence inside that transaction,
// an UPDATE of the record where it is still IN_PROGRESS under the request's
// lease token and not expired, and commits; the client gets the response
// after the commit. When the fence updates nothing (the record was stolen
// before the transaction began, or expired), everything rolls back and the
// middleware answers 503 lease_lost. A HandlerTx has no Commit or
// Rollback: to abandon its writes, a handler answers with a status that
// releases the key (a 5xx by default) or panics.
//
// The transaction is BEGIN IMMEDIATE: it holds the file's write lock for
// the handler's whole run. So transactional handlers on one file run one
// at a time, and every other write waits for the one that runs: the
// Store's own (new keys, completes, releases, other keys' heartbeats) for
// as long as their context allows, another process's for the busy timeout,
// after which it fails with SQLITE_BUSY. No other writer can steal the
// record meanwhile. The middleware's heartbeat extends the lease of a
// transactional request through its own transaction (see Store.Extend), so
// a handler that runs longer than its lease is not cancelled. Keep
// transactional handlers short.
//
// # Outbox and state records
//
// The file holds the transactional outbox and state records too, through
// packages outbox, outbox/relay and state, whose state machines are
// written once (outbox/lifecycle, state) with a SQLite dialect where the
// SQL differs. Open creates their tables (OutboxSchema, StateSchema). On a
// transactional route, outbox.Enqueue and outbox.Cancel write in the
// request's transaction (HandlerTx.Outbox), as a state Transition does
// (Store.States); Store.Relay publishes the messages, woken in the process
// when a transaction commits some, and polling for those of other
// processes. Store.OutboxDB gives the file to the outbox's edges, each
// writing statement in the Store's write turn.
//
// # Durability
//
// With synchronous=FULL in WAL mode, SQLite syncs the WAL to disk at every
// commit: a record acknowledged to the middleware (and, on a
// transactional route, the handler's writes with it) survives a crash of
// the process, of the operating system, or a power loss, on storage that
// honours its syncs.
//
// So every acquire that writes (a new key, a steal) waits for the disk,
// and on a busy disk one sync can take hundreds of milliseconds. The
// middleware refuses a lease whose acquire took more than half of it:
// it releases the record unused and answers 503 store_unavailable ("the
// idempotency store answered too slowly"), and its event says how long
// the acquire took. A lease of seconds (the middleware's default is 10s)
// leaves room for a slow sync; a lease under a second may see such 503s
// on a loaded machine. The record released, the client's retry acquires
// the key afresh.
//
// # Purge
//
// An expired record is absent to every call from the instant it expires,
// whether or not its row is still there. Purge deletes expired rows in
// bounded batches along the index on expires_at: call it from a job of
// your own, or let the Store run it (WithPurgeInterval).
package sqlitestore
