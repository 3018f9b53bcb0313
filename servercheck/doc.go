// Package servercheck judges whether a deployment keeps idempotency
// records safely: Redis for redisstore (Redis: single node, Sentinel,
// Cluster or Ring) and PostgreSQL for pgstore (Postgres). Each check only
// reads the server's settings and state and returns a Report, one Finding
// per item (and per node), each with a Verdict: Fail when a duplicate can
// run a handler a second time in ordinary operation or the store cannot
// work, Warn when a restart, a failover or a full host can lose records,
// OK, or Info for a fact it does not judge.
//
// The stores never run a check themselves: the commands it needs (INFO and
// CONFIG GET on Redis) are often denied by managed services and
// ACL-restricted users. Run it where the deployment is decided: in a
// pipeline with idemctl check (cmd/idemctl), which exits with status 1 on a
// Fail, or from the application at start-up, logging what is unsafe:
//
//	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
//	defer cancel()
//	report, err := servercheck.Redis(ctx, client)
//	if err != nil {
//		logger.Warn("could not check the Redis server", "error", err)
//	}
//	report.Log(ctx, logger) // each Fail at Error, each Warn at Warn
package servercheck
