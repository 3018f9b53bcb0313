// Package idemnats consumes NATS JetStream messages with a handler that
// runs once per message key, on any idempotency.Store, and acks each
// message only after its record completed.
//
// A Processor runs its handler through idempotency.Do: the key is the
// message's Nats-Msg-Id header by default (or a function of the message:
// WithKey, HeaderKey), the fingerprint the SHA-256 of its body (WithPayload).
// A duplicate (the same message redelivered, or published again with the
// same key) replays the stored result and is acked without running the
// handler. Process handles one message; Consume wraps a jetstream.Consumer's
// Consume:
//
//	r := idempotency.NewRunner(store)
//	p := idemnats.NewProcessor(r, "orders.charge", charge, idemnats.WithKey(idemnats.HeaderKey("Order-Id")))
//	err := p.Consume(ctx, consumer)
//
// # What each message gets
//
//	situation                                              message gets                  because
//	-----------------------------------------------------  ----------------------------  ------------------------------------------
//	the handler ran and its result is stored               Ack, confirmed, sent after    a redelivery replays the result
//	                                                       the record completed
//	the key's record is complete (a replay), with or       Ack                           the handler ran once already
//	without its result (ErrResultOmitted)
//	the handler returned an error, or panicked             Nak after WithNakDelay        the key was released: a redelivery runs
//	                                                                                     the handler again, up to MaxDeliver
//	another consumer holds the key (*InFlightError)        Nak after Remaining, the      the redelivery replays its result, or takes
//	                                                       holder's lease                over if the holder died
//	same key, another payload (ErrFingerprintMismatch);    Term, reported                a redelivery would meet the same
//	no key or an invalid one (ErrNoKey, ErrInvalidKey);
//	an unreadable record (ErrCorruptRecord)
//	not transactional: the handler ran, but its record     Ack, reported                 its effects stand; a redelivery after the
//	could not be stored (ErrLeaseLost, a store error)                                    lease could run the handler again
//	transactional: nothing was committed (ErrLeaseLost,    Nak after WithNakDelay,       a redelivery replays what was committed
//	ErrOutcomeUnknown, ErrResultTooLarge, begin failed)    reported                      or runs the handler once
//	the store failed before the handler ran (unreachable,  Nak after WithNakDelay,       nothing ran
//	ErrStoreFull), or ctx ended first                      reported
//	while the handler runs, and while Do waits for         InProgress every AckWait/3    the message stays with its consumer while
//	another holder (idempotency.WithWait)                                                the lease heartbeats
//
// "Reported" means passed to the error handler (WithErrorHandler; by
// default a Warn record on slog.Default()), which receives every error
// Process returns except *idempotency.InFlightError. Term is plain Term:
// nats-server releases before 2.10.4 ignore a term with a reason.
//
// An ack is a confirmed one (DoubleAck), bounded by AckWait/3: an ack
// that never reached the server is reported, not silent, and costs only a
// replay when the server redelivers the message. Until the ack lands the
// message is the consumer's; after the record completed, every later
// delivery of it (or of another message with its key) is acked without
// running the handler, for the Runner's TTL (idempotency.WithTTL).
//
// # Long handlers, dead consumers
//
// A handler may outlive the consumer's AckWait: in-progress acks keep its
// message from being redelivered while the Runner's heartbeat extends its
// lease. When its consumer dies, both stop: the server redelivers the
// message after AckWait, and the delivery that meets the still-live lease
// is naked until the lease ends, after which a consumer takes the record
// over (the handler's Info.Epoch is then one higher) and runs the handler.
// Choose the lease (idempotency.WithLease) near the AckWait, so that a
// takeover comes soon after a redelivery.
//
// Every delivery counts towards the consumer's MaxDeliver, naks included:
// a message naked while another consumer holds its key can run out of
// deliveries, which is harmless while the holder completes the key, but a
// holder that then fails leaves nothing to retry. Leave MaxDeliver
// unlimited, or well above the retries you expect, and bound the
// handler's own retries with it.
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
