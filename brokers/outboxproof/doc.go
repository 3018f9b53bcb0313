// Package outboxproof holds, in its tests, the proofs of the outbox on
// real servers: relay processes (outbox/relay) publishing through the
// JetStream sink (brokers/nats/natsink) and the RabbitMQ sink
// (brokers/rabbitmq), killed with SIGKILL between the broker's confirm and
// marking a message done, with the broker stopped under load, with their
// PostgreSQL connections killed in the middle of a claim, three at once;
// and the whole loop, from HTTP requests with duplicates to a consumer's
// rows, with SIGKILL at each hop.
//
// The proofs of the messages' lifecycle (outbox/lifecycle) run the same
// way: rows no relay can read, written by hand among healthy messages,
// set apart alone; scheduled messages never presented before their
// NotBefore; a message canceled or suspended while the relay presenting
// it is stopped (SIGSTOP), never published after the cancel and never
// marked done by that relay, and a relay stopped past its claim's lease
// fenced once continued; and local runs (outbox/local) of relays killed
// in the middle of their work, each message's effect committed once.
//
// It is a module of its own so that both brokers' clients stay out of
// the library's go.mod and out of each other's module. It has no code
// outside its tests:
//
//	go test -count=1 ./...                       # the CI version
//	IDEMPOTENCY_OUTBOX_LONG=1 go test -count=1 ./...  # more messages, more kills, a 30s broker outage
//
// The tests start their own nats-server -js (natstest) and use the
// RabbitMQ broker at RABBITMQ_URL or on 127.0.0.1:5672, in queues of their
// own (rabbittest); the RabbitMQ outage stops a node of the test binary's
// own, started from the machine's RabbitMQ installation
// (rabbittest.PrivateNode), never that broker. PostgreSQL is used as the
// library's tests use it: a database of their own per test, whose
// connections alone the tests kill.
package outboxproof
