package redisstore_test

import (
	"testing"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/storetest"
	"github.com/redis/go-redis/v9"
)

// TestConformance runs the Store conformance suite on a single node: one
// server and client, a Store per subtest.
func TestConformance(t *testing.T) {
	c := newClient(t)
	storetest.Run(t, func(t *testing.T) idempotency.Store {
		return newStore(t, c)
	})
}

// TestConformanceCluster runs the suite on a 3-master Cluster.
func TestConformanceCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { cc.Close() })
	storetest.Run(t, func(t *testing.T) idempotency.Store {
		return newStore(t, cc)
	})
}
