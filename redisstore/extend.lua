-- extend.lua: the extend edge (heartbeat). Pushes the lease of the
-- IN_PROGRESS record held by the caller's token to lease from now, and the
-- key's expiry to the later of lease and TTL deadline.
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
local lease = tonumber(ARGV[2])

local f = redis.pcall('HMGET', key, 'state', 'token', 'expires_at')
if f['err'] then
  return {-1, 'key does not hold a hash: ' .. f['err']}
end
if f[1] ~= 'in_progress' or f[2] ~= token then return {0} end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease_at = now + lease
redis.call('HSET', key, 'lease_at', lease_at)
redis.call('PEXPIREAT', key, math.max(lease_at, tonumber(f[3]) or 0))
return {1}
