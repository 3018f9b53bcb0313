// Package idemrabbit connects RabbitMQ to the idempotency library: Sink
// publishes an outbox's messages with publisher confirms (the outbox.Sink
// of a relay, outbox/relay), and a Processor runs a consumer's handler
// once per message ID with the function API (idempotency.Do).
//
// The relay delivers at least once: it publishes a message again when it
// cannot know whether the broker took it (a confirm that never came, a
// relay that died between the confirm and marking the message done).
// RabbitMQ has no deduplication of its own, so the same message can reach
// a queue twice, with the same message_id (the outbox message's ID):
//
//	sink := idemrabbit.NewSink("amqp://guest:guest@127.0.0.1:5672/")
//	defer sink.Close()
//	err := relay.New(pool, sink).Run(ctx)
//
// and the consumer deduplicates on it, with a Runner on the store of its
// choice (on pgstore with WithTransaction(true), its writes commit with
// the key's record), told the queue's delivery limit:
//
//	runner := idempotency.NewRunner(store, idempotency.WithTransaction(true), idempotency.WithWait(10*time.Second))
//	p := idemrabbit.NewProcessor(runner, "payments.apply", apply, idemrabbit.WithDeliveryLimit(20))
//	for d := range deliveries { // a consumer with manual acks
//		p.Process(ctx, d)
//	}
//
// # What each delivery gets
//
// Process translates the outcome idempotency.Do reports (Result.Outcome)
// through one table:
//
//	outcome                                    the delivery
//	-----------------------------------------  ------------------------------------------------
//	Stored, Committed, Omitted, Unprotected    acked
//	Replayed, ReplayedOmitted (the handler ran acked
//	for an earlier delivery)
//	Unrecorded (ran; its record not stored)    acked, the error reported: its effects stand
//	InFlight (another call holds the key)      kept, unacked: Do waits for the holder
//	                                           (WaitForHolder) until it replays or takes
//	                                           over; requeued if ctx ends
//	Released (the handler failed or panicked), held for the backoff (WithBackoff), then
//	LeaseLost, CommitUnknown,                  requeued; the last delivery (WithDeliveryLimit)
//	StoreUnavailable, StoreFull, Canceled      is rejected at once instead, and reported
//	                                           with ErrLastDelivery
//	Mismatch (the key with another body),      rejected, the error reported
//	Corrupt, Invalid (no message_id), TooLarge
//
// Rejected means without requeue: the queue dead-letters the message when
// it has a dead-letter exchange, and drops it otherwise. Every error
// Process returns also goes to the error handler (WithErrorHandler).
//
// # Delivery limits
//
// A quorum queue counts the deliveries of each message and gives up on it
// past its delivery limit (x-delivery-limit, or the delivery-limit
// policy): it dead-letters it, or drops it without a dead-letter exchange,
// and nobody is told. Classic queues have no limit and count nothing:
// they only mark a redelivery (Redelivered).
//
// On RabbitMQ 3.x (measured on 3.10.8) a quorum queue has no limit unless
// one is set. With x-delivery-limit n it delivers a message n+1 times: the
// first delivery has no x-delivery-count header, the redeliveries carry 1
// to n, and the (n+1)-th is the last. Every return counts: basic.reject
// and basic.nack with requeue alike, and a delivery left unacked when its
// channel closed (with its connection, or past consumer_timeout). With
// n = 0 the first delivery is the last.
//
// On RabbitMQ 4.x every quorum queue has a limit, 20 unless set (-1 turns
// it off). Its documentation describes x-delivery-count as the count of
// unsuccessful deliveries, which the limit applies to; recent releases
// also count every delivery, successful or not, in x-acquired-count.
//
// So a consumer that requeues a message it could not handle yet spends one
// of the message's deliveries. Process never spends one it does not own: a
// duplicate whose key another call holds keeps its delivery, unacked,
// rather than requeueing it (requeued at once, it would meet the same
// holder again and again, and could spend the queue's whole limit in
// milliseconds and be dropped while the holder still runs). A failing
// handler is retried with a bounded, jittered exponential backoff,
// counted from x-delivery-count (on a classic queue, from Redelivered,
// which gives one step), so that it does not spin through the limit
// either: Process holds the delivery for the backoff, then requeues it
// with basic.reject, the explicit failure signal. Tell the Processor the
// queue's limit (WithDeliveryLimit): it then rejects the last delivery of
// a message rather than requeueing it, so that the queue dead-letters it,
// and reports it with ErrLastDelivery and the reason, for the application
// to act on.
//
// JetStream has the same kind of budget, a consumer's MaxDeliver; see
// package idemnats.
//
// # Holding deliveries
//
// A delivery Process holds (waiting for a holder, or for its backoff) is
// unacked, and counts toward the channel's prefetch (Qos). Process blocks
// while it holds one: call it from several goroutines, with a prefetch of
// at least as many, so that one message's backoff does not stall the
// others. RabbitMQ closes a channel whose delivery stays unacked past the
// broker's consumer_timeout (30 minutes by default), and every delivery
// unacked on it goes back to its queue, counted: keep
// the backoff's ceiling, the Runner's lease, and the handler's run well
// under it. A waiting duplicate is woken by the store as soon as the
// holder ends, and checks again when the holder's lease may have run out.
//
// # Guarantees
//
// A delivery is acked only after its record completed, or was found
// complete, but for a handler that ran and whose record could not be
// stored (Unrecorded) or that ran without one (Unprotected, a Runner with
// idempotency.WithFailOpen): their effects stand. On a transactional Runner (idempotency.WithTransaction,
// pgstore) the handler writes through pgstore.TxFromContext(ctx), and its
// writes commit with the record: once per message ID, whatever dies or is
// redelivered. On other stores the handler runs at most once per lease:
// one whose consumer died, or whose lease was lost, may have had effects
// before another delivery runs it again, at the next epoch; use
// Info.Epoch (idempotency.FromContext) to fence writes elsewhere.
package idemrabbit
