// Package state keeps state records: a named record (scope, machine, id)
// with a state, a version and JSON data, moved by transitions that are a
// compare-and-swap on both the state and the version, each written with
// its event, in the same transaction, into the outbox (package outbox),
// whose relays publish it.
//
// An idempotency key makes one request happen once; it does nothing when
// two different requests race on one thing: a client's capture (key A)
// and a support agent's cancel (key B) of the same payment. A transition
// from "authorized" at version 1 lets exactly one of them win; the other
// gets a *ConflictError carrying the record as the winner left it, which
// the HTTP helper answers 409 state_conflict with the current state and
// version:
//
//	payments := state.New(pool)
//	ref := state.Ref{Scope: tenant, Machine: "payments.payment", ID: id}
//	rec, err := payments.Transition(r.Context(), ref, state.Change{From: "authorized", To: "captured", ExpectedVersion: 1})
//	if err != nil {
//		state.WriteError(w, r, err)
//		return
//	}
//
// It is not a workflow engine: no machine definitions, no timers, no
// retries of the caller's work, no deletion. The caller decides which
// transitions make sense; the Store makes them atomic and durable, and
// tells the world.
//
// # Records and transitions
//
// Create stores a record at version 1 (an existing one is an
// *ExistsError that carries it; a creation writes no event). Get reads
// one. Transition moves a record From → To only when it is in From at
// ExpectedVersion: a stale version is reported first (ReasonVersion),
// then a wrong state (ReasonState), and nothing is written. It bumps the
// version, replaces the data when the Change carries some (nil keeps it),
// and writes the transition's event into the outbox and its row into the
// record's history. A self-transition (From = To) is a transition too.
// Under PostgreSQL's READ COMMITTED, two transitions racing from one
// version serialize on the record's row lock, and on SQLite on its one
// writer at a time: the second finds the new version and is refused. History lists a record's transitions, kept with
// it after the outbox has purged their events; Deliveries shows where the
// events still in the outbox are.
//
// # Transactions
//
// Each write is one statement on PostgreSQL, one transaction of three on
// SQLite (a refused one reads the record after it, to say why). Inside a
// transactional route of the idempotency middleware or a transactional
// call of idempotency.Do (idempotency.WithTransaction(true) over a
// pgstore.Store, or a sqlitestore.Store for its States), it runs in the
// route's or call's transaction, found in its context: the transition,
// its event, its history row, the handler's own writes and the
// idempotency record commit together or not at all. A handler that
// answers a conflict with a 4xx commits nothing of the transition (there
// is nothing to commit) and its answer is replayed to the request's
// duplicates; a 5xx or a panic rolls everything back. Outside one, the
// statement is a transaction of its own.
//
// # Events
//
// A transition's event is a message of the outbox (see Event for its JSON
// body) with
//
//   - the ID EventID(ref, version): "<EventKey(ref)>/<version>", a hash of
//     the scope, machine and id with the version in the outbox's ID shape,
//     so that a transition's event cannot be written twice and a
//     redelivery deduplicates downstream;
//   - the ordering key "<scope>/<machine>/<id>" (OrderingKey): the relays
//     publish a record's events one at a time, in version order, and two
//     tenants never share a key;
//   - the topic "<prefix>.<machine>" (WithTopicPrefix, "state" by default);
//   - the Cause: the idempotency key, storage key and epoch of the request
//     or call that committed it, and its W3C trace context
//     (WithTraceContext), also in the message's headers.
//
// # Names
//
// A scope is 1 to 128 bytes of UTF-8 without control characters (the
// tenant); a machine 1 to 64 bytes of dot-separated lowercase labels
// ("payments.payment"); an id 1 to 256 bytes of UTF-8 without '/' or
// control characters; a state 1 to 64 bytes of ASCII letters, digits, '_'
// and '-', starting with a letter. Data is JSON of at most 64 KiB
// (WithMaxDataBytes), kept byte for byte. Anything else is an
// *InvalidArgumentError before any statement runs.
//
// # Errors
//
// Each error is a type with a stable code (Code) that a caller branches on
// with errors.As, or errors.Is with its sentinel: *ConflictError
// (state_conflict), *ExistsError (state_exists), *NotFoundError
// (state_not_found), *InvalidArgumentError (state_invalid_argument) and
// *StoreError (state_store_error). The first four wrap
// idempotency.ErrPermanent, so that idempotency.Do reports a function
// that returns one as idempotency.OutcomeRefused, and a consumer
// terminates its message instead of retrying it. WriteError answers each
// with its problem (Problem); idemgrpc's server interceptor answers a
// handler's with its status (ABORTED for a conflict, with the current
// record in an ErrorInfo).
//
// # Tables and engines
//
// The records and their history are two tables (pgstore.StateSchema;
// pgstore.Migrate creates them; sqlitestore.Open creates them in its file),
// and the events go into the outbox table. Each operation is one Go method
// and one SQL template whose engine-specific fragments come from a Dialect
// (PostgreSQL, SQLite), as the outbox's lifecycle does, so that another
// engine is another Dialect: New takes a PostgreSQL pool, NewDB a
// lifecycle.DB of any engine with its dialect (sqlitestore's Store.States
// calls it).
package state
