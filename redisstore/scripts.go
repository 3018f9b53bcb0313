package redisstore

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// One Lua script per edge of the record's state machine. Each touches only
// the record's own key, so it runs on a Cluster, reads the clock with TIME on
// the server, and replies with an array. Script.Run sends EVALSHA and falls
// back to EVAL when the server answers NOSCRIPT (a restarted or failed-over
// server has an empty script cache).
var (
	//go:embed acquire.lua
	acquireSrc    string
	acquireScript = redis.NewScript(acquireSrc)

	//go:embed complete.lua
	completeSrc    string
	completeScript = redis.NewScript(completeSrc)

	//go:embed release.lua
	releaseSrc    string
	releaseScript = redis.NewScript(releaseSrc)

	//go:embed extend.lua
	extendSrc    string
	extendScript = redis.NewScript(extendSrc)

	// watchScript is not an edge: it marks a record as watched, so that
	// complete and release publish on its channel.
	//go:embed watch.lua
	watchSrc    string
	watchScript = redis.NewScript(watchSrc)
)
