// Package outboxproof holds, in its tests, the proofs of the outbox on
// real servers: relay processes (outbox/relay) publishing through the
// JetStream sink (brokers/nats/natsink) and the RabbitMQ sink
// (brokers/rabbitmq), killed with SIGKILL between the broker's confirm and
// marking a message done, with the broker stopped under load, with their
// PostgreSQL connections killed in the middle of a claim, three at once;
// and the whole loop, from HTTP requests with duplicates to a consumer's
// rows, with SIGKILL at each hop. It is a module of its own so that both
// brokers' clients stay out of the library's go.mod and out of each
// other's module. It has no code outside its tests:
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
