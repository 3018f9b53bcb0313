// Package relay publishes the messages of an outbox table (package outbox)
// through an outbox.Sink: a Relay claims due messages in batches (with FOR
// UPDATE SKIP LOCKED on PostgreSQL; New) under a claim lease, presents them to the sink (a
// batch in one call to an outbox.BatchSink, which keeps a window of
// publications waiting for their confirms), and marks each outcome, taking
// the edges of the messages' lifecycle (package
// outbox/lifecycle, whose documentation has the table of states and
// edges):
//
//	the sink's outcome                        edge          the message          event
//	nil (the broker confirmed it)             done          done                 EventPublished
//	an error                                  retry         retry_wait, or dead  EventRetried, EventDead
//	                                                        at the attempt cap
//	a panic                                   retry         as an error          EventRetried, EventDead
//	an error wrapping outbox.ErrPermanent     refuse        dead at once         EventRefused
//	an error wrapping outbox.ErrSuspend       sink-suspend  suspended, no        EventSuspended
//	                                                        attempt counted
//	any, after the claim was lost             (refused)     as the operator or   EventClaimLost, then
//	                                                        another relay left   EventFenced or
//	                                                        it                   EventCanceled
//
// Besides: a claimed row it cannot read is set apart alone (unreadable:
// dead, EventUnreadable) and its batch goes on; the claim is extended
// every third of a lease while the sink works (extend, EventExtended);
// messages whose turn comes too late, or after Run's context ended, are
// handed back (release, EventReleased); claims that ran out are taken back
// (reclaim, EventReclaimed, or EventDead at the cap); finished messages
// past the retention are purged (purge, EventPurged).
//
// A relay claims the next batch and marks the previous one while the sink
// presents a batch (see Relay.Run); the database and the broker work at
// once, and the order of each key holds, for a batch in flight keeps its
// messages claimed. Several relays, in one process or many, share a table
// and partition its messages; one message of an ordering key is presented
// at a time, in enqueue order.
//
// New runs a relay on PostgreSQL (a pgxpool.Pool), woken by the
// notification of every transaction that commits messages (LISTEN/NOTIFY);
// NewDB runs one on any database a lifecycle.DB reaches in its dialect,
// woken by a channel of the process and its poll: sqlitestore's
// Store.Relay is NewDB on a SQLite file, woken when the Store's
// transactions commit messages.
package relay
