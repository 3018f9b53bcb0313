// Package outboxbench holds the outbox's benchmarks, on real servers. It
// has no code outside its tests:
//
//	go test -run '^$' -bench '^BenchmarkRelayThroughput$' -benchtime 20000x .
//	go test -run '^$' -bench '^BenchmarkCommitToStream$' -benchtime 500x .
//	go test -run '^$' -bench '^BenchmarkEnqueueCost$' -benchtime 250x . -args -rounds 20
//
// BenchmarkRelayThroughput measures, on JetStream and then RabbitMQ, in
// one run: the broker's own limit (side=limit: JetStream's
// PublishMsgAsync, or RabbitMQ's publisher confirms pipelined on one
// channel, with 256 publications waiting for their confirms at most); the
// sink's PublishBatch given the b.N messages at once (side=batch); the
// floor of the relay's work (side=floor: lifecycle's claim and done
// statements around the sink's PublishBatch, pipelined as the relay is,
// by hand, checking nothing); the relay at its defaults (side=relay, at
// concurrency 1 and 4, which a sink with PublishBatch ignores), and
// through the sink's Publish alone (side=relay-each, at concurrency 4);
// and a plain loop publishing as many messages, each waiting for its
// confirm, with 1 and 4 publishers (side=plain). Each drain starts from
// an emptied outbox holding b.N committed messages, each of an ordering
// key of its own, and the table's statistics read (ANALYZE), as
// autovacuum keeps them once a table has grown for a minute; without them
// (-args -analyze=false) the planner takes the backlog for a few rows and
// the claim reads all of it each time, the floor's as the relay's. The
// rows report messages per second, their rate over the limit (of-limit)
// and the relay's over the floor's (of-floor); the drains their commits
// (pg_stat_database.xact_commit), the server's WAL bytes
// (pg_current_wal_lsn, every database's) and the benchmark database's
// share of them (own-WAL, read with pg_walinspect when the extension is
// there) per message, and the share of the outbox's row updates that
// were heap-only (HOT-%); every row but the plain loop's the CPU time per
// message of this process (getrusage), of the PostgreSQL backends serving
// the drain and of the broker's process (/proc/<pid>/stat, when they run
// on this machine; a RabbitMQ shared with other tests counts their work
// too).
//
// BenchmarkCommitToStream commits one message at a time and reports the
// time from the end of the call's function (its record and the message
// then commit) to JetStream's ack of the relay's publication, the relay at
// its defaults: p50 and p99 in milliseconds. BenchmarkEnqueueCost puts a
// transactional route that inserts a row beside the same route that also
// enqueues one message, over loopback HTTP, round by round.
//
// JetStream comes from a private nats-server (natstest: NATS_URL, or
// Debian's nats-server), RabbitMQ from RABBITMQ_URL or 127.0.0.1:5672
// (rabbittest), PostgreSQL from internal/pgtest; a part without its server
// is skipped.
package outboxbench
