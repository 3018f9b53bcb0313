#!lua flags=allow-oom
-- release.lua: the release edge. Deletes the IN_PROGRESS record held by the
-- caller's token, then publishes on the record's channel if a waiter has
-- marked it (state "P").
--
-- The flags line lets the script run on a server at maxmemory (Redis 7 and
-- later; see scripts.go for older servers): it only frees memory.
--
-- KEYS[1]  record key (a hash); its channel is KEYS[1] .. ':changed'
-- ARGV[1]  the caller's token as the head spells it: <token length> ":" <token>
--
-- Reply (always an array): a code, named by the Go constant after it (in
-- scripts.go; TestReplyCodes checks that the two agree), then data.
--   {1}            fencedOK: released, or there was no record (a retry)
--   {0}            fencedLost: the lease is lost: held by another token, or COMPLETE
--   {-1, message}  replyCorrupt: the value under the key is not a record

local key, tok = KEYS[1], ARGV[1]

-- (.err: see complete.lua.)
local h = redis.pcall('HGET', key, 'h')
if h and h.err then return {-1, 'key does not hold a hash: ' .. h.err} end
if not h then
  if redis.call('EXISTS', key) == 0 then return {1} end
  return {0}
end
local s = string.sub(h, 1, 1)
if (s ~= 'p' and s ~= 'P') or string.sub(h, 2, #tok + 1) ~= tok then return {0} end
redis.call('DEL', key)
if s == 'P' then redis.call('PUBLISH', key .. ':changed', 'released') end
return {1}
