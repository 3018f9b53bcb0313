// Package redisbench holds the benchmarks of the middleware over
// redisstore that compare it with its floors: the bare handler plus the raw
// EVALSHA round trips a request needs at best (package load builds them),
// the record floors, and the store's own calls without the middleware.
// It has no code outside its tests:
//
//	go test -run '^$' -bench 'MiddlewareRedis|ClusterPublish' -benchmem .
//
// BenchmarkMiddlewareRedis, BenchmarkMiddlewareRedisPaired and
// BenchmarkMiddlewareRedisPhased start a private redis-server (REDIS_ADDR
// names an existing one instead); BenchmarkClusterPublish starts a
// 3-master Cluster.
package redisbench
