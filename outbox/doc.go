// Package outbox is the transactional outbox: a handler on a transactional
// route, or a function run by idempotency.Do on a transactional Runner,
// enqueues messages (Enqueue) into a table of its database in its
// transaction (PostgreSQL with pgstore, a SQLite file with sqlitestore),
// so that they commit with its record and its other writes, or not at all;
// a relay (package outbox/relay; sqlitestore's Store.Relay on a file) then
// publishes them through a Sink, at least once, with IDs stable across
// attempts for downstream deduplication.
//
// A message is a durable run whose states and edges package
// outbox/lifecycle owns: scheduled (NotBefore), ready, claimed,
// retry_wait, suspended, and finished: done, dead or canceled (Cancel).
// Enqueue refuses a message no sink could publish (see Message); a sink
// refuses a message for good (Permanent) or suspends it (Suspend); an
// operator repairs the table with idemctl outbox.
package outbox
