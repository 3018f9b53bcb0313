#!lua flags=allow-oom
-- complete.lua: the complete edge. Stores the payload and moves the record
-- held by the caller's token to COMPLETE, kept for the TTL from now, then
-- publishes on the record's channel if a waiter has marked it (watch.lua).
--
-- The flags line lets the script write on a server at maxmemory (Redis 7
-- and later; see scripts.go for older servers): a record whose handler ran
-- must be completed, or a duplicate would run the handler again once the
-- lease ran out. It may take the server past maxmemory by the size of the
-- payload.
--
-- KEYS[1]  record key (a hash)
-- ARGV[1]  lease token of the caller
-- ARGV[2]  TTL, in milliseconds (> 0)
-- ARGV[3]  meta: the encoded status, flags and headers
-- ARGV[4]  body
-- ARGV[5]  channel to publish on
--
-- Reply (always an array): a code, named by the Go constant after it (in
-- scripts.go; TestReplyCodes checks that the two agree), then data.
--   {1}            fencedOK: completed (or already completed by this token: a retry)
--   {0}            fencedLost: the lease is lost: absent, or held by another token
--   {-1, message}  replyCorrupt: the value under the key is not a record

local key, token = KEYS[1], ARGV[1]

local f = redis.pcall('HMGET', key, 'state', 'token', 'watched')
if f['err'] then
  return {-1, 'key does not hold a hash: ' .. f['err']}
end
if f[2] ~= token then return {0} end
if f[1] == 'complete' then return {1} end
if f[1] ~= 'in_progress' then
  return {-1, 'field state is missing or holds an unknown value'}
end

-- The TTL counts from now: PEXPIRE takes the caller's argument as it came,
-- so no clock read and no number formatting is needed. The key's expiry is
-- a complete record's only deadline; the last lease stays in its field,
-- where nothing reads it.
redis.call('HSET', key, 'state', 'complete', 'meta', ARGV[3], 'body', ARGV[4])
redis.call('PEXPIRE', key, ARGV[2])
if f[3] then redis.call('PUBLISH', ARGV[5], 'complete') end
return {1}
