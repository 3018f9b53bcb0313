-- watch.lua: marks a record as watched. Complete and release publish on the
-- record's channel only when it is marked, so a record nobody waits for is
-- completed without a PUBLISH (which a Cluster sends to every node). Watch
-- runs it once Redis has confirmed the subscription: an edge that runs after
-- the mark publishes to a subscriber that is already listening, and one that
-- ran before it is seen by the waiter's re-check.
--
-- KEYS[1]  record key (a hash)
--
-- Reply (always an array): a code, named by the Go constant after it (in
-- scripts.go; TestReplyCodes checks that the two agree), then data.
--   {1}            watchMarked: marked (it stays marked until the key is gone)
--   {0}            watchNoRecord: nothing to mark, and nothing to wait for
--   {-1, message}  replyCorrupt: the value under the key is not a hash
--
-- An in-progress head (field h, see acquire.lua) is marked by its state, "p"
-- becoming "P"; a COMPLETE record has nothing to wait for and is left as it
-- is.

local key = KEYS[1]

-- (.err: see complete.lua.)
local h = redis.pcall('HGET', key, 'h')
if h and h.err then return {-1, 'key does not hold a hash: ' .. h.err} end
if not h then return {0} end
if string.sub(h, 1, 1) == 'p' then redis.call('HSET', key, 'h', 'P' .. string.sub(h, 2)) end
return {1}
