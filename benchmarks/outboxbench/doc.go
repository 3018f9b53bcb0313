// Package outboxbench holds the outbox's benchmarks, on real servers. It
// has no code outside its tests:
//
//	go test -run '^$' -bench '^BenchmarkRelayThroughput$' -benchtime 2000x .
//	go test -run '^$' -bench '^BenchmarkCommitToStream$' -benchtime 500x .
//	go test -run '^$' -bench '^BenchmarkEnqueueCost$' -benchtime 250x . -args -rounds 20
//
// BenchmarkRelayThroughput drains an outbox of b.N committed messages
// through a relay (outbox/relay) and the broker's sink, beside a plain
// loop that publishes as many messages to the same broker, each waiting
// for its confirm, with as many publishers as the relay's concurrency; it
// reports messages per second. BenchmarkCommitToStream commits one message
// at a time and reports the time from the end of the call's function (its
// record and the message then commit) to JetStream's ack of the relay's
// publication: p50 and p99 in milliseconds. BenchmarkEnqueueCost puts a
// transactional route that inserts a row beside the same route that also
// enqueues one message, over loopback HTTP, round by round.
//
// JetStream comes from a private nats-server (natstest: NATS_URL, or
// Debian's nats-server), RabbitMQ from RABBITMQ_URL or 127.0.0.1:5672
// (rabbittest), PostgreSQL from internal/pgtest; a part without its server
// is skipped.
package outboxbench
