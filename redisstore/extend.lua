#!lua flags=allow-oom
-- extend.lua: the extend edge (heartbeat). Renews the lease of the
-- IN_PROGRESS record held by the caller's token from now, and pushes the
-- key's expiry out to the new lease when it would come sooner.
--
-- The flags line lets the script write on a server at maxmemory (Redis 7
-- and later; see scripts.go for older servers): it replaces the lease field
-- with one no larger, and a heartbeat refused there would let
-- a duplicate steal the record from a running handler.
--
-- The lease field is written as acquire.lua writes it: the lease's end, in
-- Unix milliseconds on the server's clock (TIME). The script does not read
-- the field, so a lease in the previous version's form is simply replaced.
--
-- KEYS[1]  record key (a hash)
-- ARGV[1]  lease token of the caller
-- ARGV[2]  lease, in milliseconds (> 0)
--
-- Reply (always an array): a code, named by the Go constant after it (in
-- scripts.go; TestReplyCodes checks that the two agree), then data.
--   {1}            fencedOK: extended
--   {0}            fencedLost: the lease is lost: absent, COMPLETE or held by another token
--   {-1, message}  replyCorrupt: the value under the key is not a record

local key, token = KEYS[1], ARGV[1]

local f = redis.pcall('HMGET', key, 'state', 'token')
if f['err'] then
  return {-1, 'key does not hold a hash: ' .. f['err']}
end
if f[1] ~= 'in_progress' or f[2] ~= token then return {0} end

local lease_ms = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', key, 'lease', string.format('%d', now + lease_ms))
-- The key expires at the later of the TTL deadline and the lease: PTTL
-- counts from now, as the new lease does. A key without expiry keeps none.
local pttl = redis.call('PTTL', key)
if pttl >= 0 and pttl < lease_ms then
  redis.call('PEXPIRE', key, ARGV[2])
end
return {1}
