#!lua flags=allow-oom
-- release.lua: the release edge. Deletes the IN_PROGRESS record held by the
-- caller's token, then publishes on the record's channel if a waiter has
-- marked it (watch.lua).
--
-- The flags line lets the script run on a server at maxmemory (Redis 7 and
-- later; see scripts.go for older servers): it only frees memory.
--
-- KEYS[1]  record key (a hash)
-- ARGV[1]  lease token of the caller
-- ARGV[2]  channel to publish on
--
-- Reply (always an array): a code, named by the Go constant after it (in
-- scripts.go; TestReplyCodes checks that the two agree), then data.
--   {1}            fencedOK: released, or there was no record (a retry)
--   {0}            fencedLost: the lease is lost: held by another token, or COMPLETE
--   {-1, message}  replyCorrupt: the value under the key is not a record

local key, token = KEYS[1], ARGV[1]

local f = redis.pcall('HMGET', key, 'state', 'token', 'watched')
if f['err'] then
  return {-1, 'key does not hold a hash: ' .. f['err']}
end
if not f[1] and redis.call('EXISTS', key) == 0 then return {1} end
if f[1] ~= 'in_progress' or f[2] ~= token then return {0} end
redis.call('DEL', key)
if f[3] then redis.call('PUBLISH', ARGV[2], 'released') end
return {1}
