package redisstore

// Unexported parts of the Cluster code, for its tests.
var (
	SameAddr      = sameAddr
	TopologyError = topologyError
)
