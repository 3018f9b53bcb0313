// Package idemnats consumes NATS JetStream messages with a handler that
// runs once per message key, on any idempotency.Store, and acks each
// message only after its record completed.
//
// A Processor runs its handler through idempotency.Do: the key is the
// message's Nats-Msg-Id header by default (or a function of the message:
// WithKey, HeaderKey, MsgIDKey), the fingerprint the SHA-256 of its body
// (WithPayload). A duplicate (the same message redelivered, or published
// again with the same key) replays the stored result and is acked without
// running the handler. Process handles one message; Consume wraps a
// jetstream.Consumer's Consume:
//
//	r := idempotency.NewRunner(store)
//	p := idemnats.NewProcessor(r, "orders.charge", charge, idemnats.WithKey(idemnats.HeaderKey("Order-Id")))
//	err := p.Consume(ctx, consumer)
//
// # What each message gets
//
// Process translates the outcome that Do reports (idempotency.Outcome,
// returned as Outcome.Reason) through one table, and never guesses it
// from errors:
//
//	outcome of Do                 message gets                        because
//	----------------------------  ----------------------------------  ---------------------------------------------
//	OutcomeStored,                Ack, confirmed, sent after the      a redelivery replays the result
//	OutcomeCommitted              record completed
//	OutcomeOmitted                Ack (an encoding error reported)    the handler ran; duplicates never run it again
//	OutcomeReplayed,              Ack                                 the handler ran once already
//	OutcomeReplayedOmitted
//	OutcomeUnrecorded             Ack, reported                       its effects stand; a redelivery after the
//	                                                                  lease could run the handler again
//	OutcomeUnprotected            Ack                                 WithFailOpen ran it without a record
//	OutcomeInFlight               kept: Do waits for the holder       the holder's message is the one to retry: a
//	                              (WaitForHolder), InProgress every   duplicate spends no delivery while it waits
//	                              AckWait/3; Nak only if that wait
//	                              ends otherwise
//	OutcomeReleased (an error,    Nak after the backoff, reported     the key was released: a redelivery runs
//	a panic, which goes on)                                           the handler again
//	OutcomeLeaseLost,             Nak after the backoff, reported     nothing was committed, or a retry settles it
//	OutcomeCommitUnknown
//	OutcomeStoreUnavailable,      Nak after the backoff (at least     nothing ran
//	OutcomeStoreFull              RetryAfter), reported
//	OutcomeCanceled (ctx ended)   Nak after the backoff, not          the consumer stops; the message comes back
//	                              reported
//	OutcomeMismatch,              Term, reported                      a redelivery would meet the same
//	OutcomeCorrupt,
//	OutcomeTooLarge,
//	OutcomeInvalid (no key:
//	ErrNoKey; a bad key)
//
// Every Nak on the consumer's last delivery is a Term instead (see
// MaxDeliver below). While the handler runs, and while a duplicate waits,
// the message gets InProgress every third of its AckWait, so that it
// stays with its consumer while the lease heartbeats.
//
// "Reported" means passed to the error handler (WithErrorHandler; by
// default a Warn record on slog.Default()), which receives every error
// Process returns except that of a message naked because ctx ended (the
// consumer stops: the message comes back).
//
// A Nak's delay is a backoff by the message's delivery count: the first
// is at most WithNakDelay (1s), each later one twice as long, up to
// WithMaxNakDelay (5m), each less a random part of under half of it, and
// never shorter than the RetryAfter that Do gave. A failing message is
// never redelivered at once.
//
// An ack is a confirmed one (DoubleAck), bounded by AckWait/3: an ack
// that never reached the server is reported, not silent, and costs only a
// replay when the server redelivers the message. Until the ack lands the
// message is the consumer's; after the record completed, every later
// delivery of it (or of another message with its key) is acked without
// running the handler, for the Runner's TTL (idempotency.WithTTL).
//
// # MaxDeliver
//
// What counts toward a consumer's MaxDeliver: every delivery of a
// message, the first included. A redelivery comes after a Nak, or after
// the AckWait passed without an ack or an in-progress ack (a consumer
// that died, a message buffered too long in the client). InProgress does
// not count, and a Term ends the message.
//
// A duplicate that finds its key in flight never spends a delivery it does
// not own: instead of a Nak, Process keeps its message with in-progress
// acks while Do waits for the holder (idempotency.Call.Wait is
// idempotency.WaitForHolder: woken by the store when the holder ends, and
// checking again when its lease may have run out), until the record is
// complete (Ack, a replay), or released or abandoned (the handler runs
// here). Only when ctx ends first (the consumer stops) is the message
// naked, not reported, and that redelivery counts. So when the holder
// fails, its duplicates still have their deliveries to run the handler.
//
// The last delivery: Process knows the consumer's MaxDeliver (Consume
// reads it from the consumer; for Process, WithMaxDeliver), and on a
// message's last delivery (NumDelivered at least MaxDeliver), where the
// server would silently drop a Nak's redelivery, it terms the message
// instead, sets Outcome.LastDelivery, and reports an error wrapping
// ErrLastDelivery and the reason: dead-letter the message there. The term
// is plain: nats-server releases before 2.10.4 ignore a term with a
// reason; with WithConn, a server known to honour one gets the outcome as
// the reason.
//
// # Keys
//
// DefaultKey takes the Nats-Msg-Id header, the key the producer chose.
// A message without one is keyed by its stream, stream sequence and the
// time the stream stored it: every redelivery shares that key, but a
// message stored after its stream was deleted and created again, under
// the same sequence, does not. A publisher that retries without
// Nats-Msg-Id stores its message twice, and both run; MsgIDKey refuses
// (terms) messages without Nats-Msg-Id instead, and HeaderKey takes a
// business key that every publication of a request carries.
//
// # Long handlers, dead consumers
//
// A handler may outlive the consumer's AckWait: in-progress acks keep its
// message from being redelivered while the Runner's heartbeat extends its
// lease. When its consumer dies, both stop: the server redelivers the
// message after AckWait, and the delivery that meets the still-live lease
// waits for it to end, after which it takes the record over (the
// handler's Info.Epoch is then one higher) and runs the handler. Choose
// the lease (idempotency.WithLease) near the AckWait, so that a takeover
// comes soon after a redelivery.
//
// # Guarantees
//
// On a transactional Runner (idempotency.WithTransaction, on pgstore) the
// handler writes through pgstore.TxFromContext(ctx), and its writes commit
// with the record: they happen once per key, whatever dies or is
// redelivered. On other stores a handler runs at most once per lease: one
// whose consumer died, or whose lease was lost, may have had effects
// before another consumer runs it again, at the next epoch; use
// Info.Epoch to fence writes elsewhere.
package idemnats
