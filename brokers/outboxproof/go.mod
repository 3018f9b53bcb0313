module github.com/go-idempotency/idempotency/brokers/outboxproof

go 1.26.0

require (
	github.com/go-idempotency/idempotency v0.0.0
	github.com/go-idempotency/idempotency/brokers/nats v0.0.0
	github.com/go-idempotency/idempotency/brokers/rabbitmq v0.0.0
	github.com/jackc/pgx/v5 v5.12.0
	github.com/nats-io/nats.go v1.55.0
	github.com/rabbitmq/amqp091-go v1.16.0
)

require (
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/klauspost/compress v1.20.0 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	golang.org/x/crypto v0.57.0 // indirect
	golang.org/x/sync v0.23.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
)

replace github.com/go-idempotency/idempotency => ../..

replace github.com/go-idempotency/idempotency/brokers/nats => ../nats

replace github.com/go-idempotency/idempotency/brokers/rabbitmq => ../rabbitmq
