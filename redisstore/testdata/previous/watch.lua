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

local key = KEYS[1]

local present = redis.pcall('HEXISTS', key, 'state')
if type(present) == 'table' and present['err'] then
  return {-1, 'key does not hold a hash: ' .. present['err']}
end
if present == 0 then return {0} end
redis.call('HSET', key, 'watched', '1')
return {1}
