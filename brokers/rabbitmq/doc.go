// Package idemrabbit connects RabbitMQ to the idempotency library: Sink
// publishes an outbox's messages with publisher confirms (the outbox.Sink
// of a relay, outbox/relay), and Process runs a consumer's handler once
// per message ID with the function API (idempotency.Do).
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
// the key's record):
//
//	runner := idempotency.NewRunner(store, idempotency.WithTransaction(true), idempotency.WithWait(5*time.Second))
//	for d := range deliveries {
//		_, _, err := idemrabbit.Process(ctx, runner, "payments.apply", d, apply)
//		...
//	}
package idemrabbit
