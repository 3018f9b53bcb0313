#!lua flags=allow-oom
-- complete.lua: the complete edge. Stores the payload and moves the record
-- held by the caller's token to COMPLETE, kept for the TTL from now, then
-- publishes on the record's channel if a waiter has marked it (state "P").
--
-- The flags line lets the script write on a server at maxmemory (Redis 7
-- and later; see scripts.go for older servers): a record whose handler ran
-- must be completed, or a duplicate would run the handler again once the
-- lease ran out. The Store sends the script as it is only with a payload of
-- at most its allowance (WithMaxmemoryAllowance, 4 KiB by default) or with
-- a marked one (the status, with or without the headers, no body). A larger
-- payload goes with the flags line "#!lua" instead (scripts.go derives that
-- variant from this file), which Redis refuses at maxmemory before the
-- script runs; the Store then sends the marked payload with this one. A
-- full server refuses new records, so past maxmemory it grows by at most
-- one allowance per record that was in progress when it got there.
--
-- KEYS[1]  record key (a hash); its channel is KEYS[1] .. ':changed'
-- ARGV[1]  the caller's token as the head spells it: <token length> ":" <token>
-- ARGV[2]  TTL, in milliseconds (> 0)
-- ARGV[3]  payload: the encoded status, headers and body, or the marked
--          payload that replaces them on a server at maxmemory
--
-- Reply (always an array): a code, named by the Go constant after it (in
-- scripts.go; TestReplyCodes checks that the two agree), then data.
--   {1}            fencedOK: completed (or already completed by this token: a retry)
--   {0}            fencedLost: the lease is lost: absent, or held by another token
--   {-1, message}  replyCorrupt: the value under the key is not a record
--
-- The head (field h, see acquire.lua) opens with the state and the token, so
-- one comparison fences the call. The COMPLETE head is the in-progress one
-- with state "c"; the payload goes to the field named "c" followed by the
-- fingerprint, which a replay reads alone. A retry finds the record complete
-- and writes nothing, so the payload stored first stays, full or marked.

local key, tok = KEYS[1], ARGV[1]

-- redis.pcall returns an error as a table {err = message}; indexing a
-- string finds the string library, which has no err, so .err tells the two
-- apart without calling type() (a global look-up, measurably slower here).
local h = redis.pcall('HGET', key, 'h')
if h and h.err then return {-1, 'key does not hold a hash: ' .. h.err} end
if not h or string.sub(h, 2, #tok + 1) ~= tok then return {0} end
local s = string.byte(h)
if s == 99 then return {1} end -- "c"
if s ~= 112 and s ~= 80 then return {-1, 'field h: unknown state'} end -- "p", "P"
local fi = string.match(h, '^[1-9]%d*:[1-9]%d*:()', #tok + 2)
if not fi then return {-1, 'field h: malformed epoch or lease end'} end

-- The TTL counts from now: PEXPIRE takes the caller's argument as it came.
-- The key's expiry is a complete record's only deadline.
redis.call('HSET', key, 'h', 'c' .. string.sub(h, 2), 'c' .. string.sub(h, fi), ARGV[3])
redis.call('PEXPIRE', key, ARGV[2])
if s == 80 then redis.call('PUBLISH', key .. ':changed', 'complete') end
return {1}
