#!lua flags=allow-oom
-- extend.lua: the extend edge (heartbeat). Renews the lease of the
-- IN_PROGRESS record held by the caller's token from now, and pushes the
-- key's expiry out to the new lease when it would come sooner.
--
-- The flags line lets the script write on a server at maxmemory (Redis 7
-- and later; see scripts.go for older servers): it replaces the lease field
-- with one of about the same size, and a heartbeat refused there would let
-- a duplicate steal the record from a running handler.
--
-- KEYS[1]  record key (a hash)
-- ARGV[1]  lease token of the caller
-- ARGV[2]  lease, in milliseconds (> 0)
--
-- Reply (always an array):
--   {1}            extended
--   {0}            lease lost: absent, COMPLETE or held by another token
--   {-1, message}  the value under the key is not a record

local key, token = KEYS[1], ARGV[1]

local f = redis.pcall('HMGET', key, 'state', 'token')
if f['err'] then
  return {-1, 'key does not hold a hash: ' .. f['err']}
end
if f[1] ~= 'in_progress' or f[2] ~= token then return {0} end

-- The lease field has the layout acquire.lua writes.
local t = redis.call('TIME')
redis.call('HSET', key, 'lease', t[1] .. ':' .. t[2] .. ':' .. ARGV[2])
-- The key expires at the later of the TTL deadline and the lease: PTTL
-- counts from now, as the new lease does. A key without expiry keeps none.
local pttl = redis.call('PTTL', key)
if pttl >= 0 and pttl < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', key, ARGV[2])
end
return {1}
