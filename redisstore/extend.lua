#!lua flags=allow-oom
-- extend.lua: the extend edge (heartbeat). Renews the lease of the
-- IN_PROGRESS record held by the caller's token to run ARGV[2] from now, and
-- pushes the key's expiry out to the new lease's end when it would come
-- sooner.
--
-- The flags line lets the script write on a server at maxmemory (Redis 7
-- and later; see scripts.go for older servers): it replaces the head with
-- one at most a few bytes longer, and a heartbeat refused there would let a
-- duplicate steal the record from a running handler.
--
-- KEYS[1]  record key (a hash)
-- ARGV[1]  the caller's token as the head spells it: <token length> ":" <token>
-- ARGV[2]  lease, in milliseconds (> 0)
--
-- Reply (always an array): a code, named by the Go constant after it (in
-- scripts.go; TestReplyCodes checks that the two agree), then data.
--   {1}            fencedOK: extended
--   {0}            fencedLost: the lease is lost: absent, COMPLETE or held by another token
--   {-1, message}  replyCorrupt: the value under the key is not a record
--
-- The lease end in the head (see acquire.lua) becomes the server's TIME
-- plus ARGV[2], and the key's expiry moves to it when the key would expire
-- sooner.

local key, tok = KEYS[1], ARGV[1]

-- (.err: see complete.lua.)
local h = redis.pcall('HGET', key, 'h')
if h and h.err then return {-1, 'key does not hold a hash: ' .. h.err} end
if not h or string.sub(h, 2, #tok + 1) ~= tok then return {0} end
local s = string.sub(h, 1, 1)
if s ~= 'p' and s ~= 'P' then return {0} end
local e, fi = string.match(h, '^([1-9]%d*):[1-9]%d*:()', #tok + 2)
if not e then return {-1, 'field h: malformed epoch or lease end'} end

local lease_ms = tonumber(ARGV[2])
local t = redis.call('TIME')
local d = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + lease_ms
-- The head first: a server before Redis 7 at maxmemory refuses it before
-- anything changed (PEXPIRE is not refused there).
redis.call('HSET', key, 'h', string.sub(h, 1, #tok + 1) .. e .. ':' .. string.format('%d', d) .. ':' .. string.sub(h, fi))
local pttl = redis.call('PTTL', key)
if pttl >= 0 and pttl < lease_ms then redis.call('PEXPIRE', key, ARGV[2]) end
return {1}
