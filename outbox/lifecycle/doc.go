// Package lifecycle owns the state machine of an outbox message: a durable
// run, from its enqueue in a handler's transaction to its end. Every
// statement on the outbox table is here (the table's schema aside, in
// pgstore/outbox.sql and sqlitestore/outbox.sql): outbox.Enqueue and
// outbox.Cancel, the relay (outbox/relay), package state and idemctl
// outbox take the edges below by calling the methods of Table, each in a
// transaction or on a pool as the caller chooses (see DB).
//
// # States
//
// A message's state is the status column of its row.
//
//	state       meaning
//	scheduled   enqueued with a NotBefore later than the enqueue's clock; not
//	            presented before its due_at
//	ready       due, waiting for a relay
//	claimed     a relay holds its claim (claim_token, claim_until on the
//	            database's clock) and presents it to its sink
//	retry_wait  the sink failed; due again at due_at (a jittered backoff);
//	            last_error kept
//	suspended   held by an operator (by topic, ordering key or ID) or by the
//	            sink (a budget exhausted, a downstream closed), until resumed;
//	            attempts not counted; suspended_reason says why
//	done        the sink confirmed it (finished)
//	dead        out of attempts, refused permanently by the sink, or
//	            unreadable (finished); last_error says why
//	canceled    canceled by ID (finished); last_error reads
//	            "canceled: <reason>"
//
// The finished states, done, dead and canceled, never change, but by an
// operator's requeue, which is recorded (requeues, requeued_at,
// requeued_by), and the purge, which deletes.
//
// # Edges
//
// Each edge is one method of Table holding its logic (the states it moves
// from and to, as the Edge values of this package, rendered into its
// statement; the checks of its arguments; the decoding of its result) and
// one SQL template, in which only what one database engine writes its own
// way varies, supplied by a Dialect.
//
//	edge          from                        to                          by                  attempts
//	enqueue       -                           ready, or scheduled when    a handler's         0
//	                                          NotBefore is later than     transaction
//	                                          the database's clock        (outbox.Enqueue)
//	claim         scheduled, ready, retry_wait claimed (token, relay,     relay               -
//	              with due_at passed, and no  claim_until = now + lease)
//	              earlier message of the key
//	              not finished
//	extend        claimed under the token     claimed, claim_until =      relay, every        -
//	                                          now + lease; returns the    lease/3 while the
//	                                          ids still held              sink works
//	release       claimed under the token     ready, due as it was        relay (stopping,    -
//	                                                                      too late)
//	done          claimed under the token     done, finished_at           relay after the     +1
//	                                                                      sink's confirm, or
//	                                                                      a local run's
//	                                                                      transaction
//	retry         claimed under the token     retry_wait after the        relay after a       +1
//	                                          backoff, last_error; dead   failed
//	                                          at the attempt cap          presentation
//	refuse        claimed under the token     dead at once, last_error =  the sink's          +1
//	                                          the sink's reason           permanent refusal
//	unreadable    claimed under the token     dead at once, last_error =  relay, for a row    +1
//	                                          "unreadable: <error>"       it cannot read
//	sink-suspend  claimed under the token     suspended, suspended_reason the sink            not counted
//	reclaim       claimed, claim_until passed retry_wait due now          any relay           +1
//	                                          ("claim_expired: ..."), or
//	                                          dead at the cap
//	suspend       scheduled, ready,           suspended (a claimed one    operator: by topic, not counted
//	              retry_wait, claimed         loses its token: the        ordering key or IDs
//	                                          relay's marks are refused)
//	resume        suspended                   ready, due now; scheduled   operator: the same  -
//	                                          when its due_at is later    selectors
//	schedule      scheduled, ready,           scheduled at a new due_at   operator, by ID     -
//	              retry_wait                  (ready when it has passed)
//	cancel        any not finished            canceled, finished_at,      application (also   -
//	                                          "canceled: <reason>"; a     in a transactional
//	                                          claimed one loses its token route) and operator,
//	                                                                      by ID
//	requeue       done, dead, canceled        ready, due now, attempts 0, operator, by ID or  reset
//	                                          requeues + 1, requeued_at,  filter
//	                                          requeued_by
//	purge         done, dead, canceled,       deleted                     relay, operator     -
//	              finished before the
//	              retention
//
// Beside the edges, read-only queries: the relay's idle state (RelayState:
// the lag of the earliest due message, the time until the next one falls
// due, until the next claim runs out), idemctl's status (Status: the count
// of each state, the oldest due message, the latest errors grouped, the
// relays holding claims, the suspended messages by reason), Lookup (read
// and lock named messages, for an operator's all-or-nothing change),
// States and List.
//
// # Order
//
// A message of an ordering key is claimed only when no earlier message of
// the key (a smaller id) is in a state that is not finished: scheduled,
// ready, claimed, retry_wait or suspended. One message per key is in
// flight, in id order; an earlier message that is scheduled for later, or
// suspended, holds the later ones back until it is presented, resumed or
// canceled.
//
// # Engines
//
// The edges run on PostgreSQL (the PostgreSQL dialect, on a pgx handle
// made a DB by Pgx) and on SQLite (the SQLite dialect, on a database/sql
// handle made a DB by SQL; package sqlitestore gives one that takes its
// write turn). The statements differ only in the fragments of a Dialect.
// What the engines do differently is in how they order writers:
// PostgreSQL runs claims and edges at once, under row locks (SKIP LOCKED
// partitions concurrent claims, an advisory lock per ordering key orders
// the enqueues of one key) and wakes relays with NOTIFY at commit; SQLite
// runs one write transaction at a time, which gives the same orders
// without locks, and has no notifications (sqlitestore wakes the relays of
// its process, and relays elsewhere poll).
//
// # Fencing
//
// Every mark of a relay (extend, release, done, retry, refuse, unreadable,
// sink-suspend) changes a row only where its status is claimed and its
// claim_token is the relay's. A reclaim, or an operator's suspend or
// cancel of a claimed message, clears the token: the relay's later marks
// change nothing, and its next extend finds the message gone, so that it
// cancels its sink's context.
package lifecycle
