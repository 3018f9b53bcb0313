-- acquire.lua: the acquire and steal edges. Looks the record up and, when
-- the caller may run the handler, takes a lease on it.
--
-- KEYS[1]  record key (a hash)
-- ARGV[1]  "c" followed by the request fingerprint: the name of the payload
--          field of a COMPLETE record made by the same request
-- ARGV[2]  the caller's token as heads spell it: <token length> ":" <token>
-- ARGV[3]  lease, in milliseconds (1 to 13 digits)
-- ARGV[4]  key expiry of a new lease, in milliseconds: the later of the
--          lease and the TTL
-- ARGV[5]  present ("1") when the caller wants a COMPLETE record's time
--          left (AcquireRequest.WantExpiresIn): a replay then adds its PTTL
--
-- Reply (always an array): a code, named by the Go constant after it (in
-- scripts.go; TestReplyCodes checks that the two agree), then data.
--   {1, epoch}                 acquireAcquired: no live record; fresh lease, epoch 1
--   {2, epoch}                 acquireStolen: the lease had expired; epoch + 1
--   {3, payload[, pttl]}       acquireCompleted: the stored payload, for replay, and, with ARGV[5], the key's PTTL (-1: no expiry)
--   {4, epoch, remaining_ms}   acquireInFlight: another token's lease is live
--   {5}                        acquireMismatch: another fingerprint; nothing changed
--   {-1, message}              replyCorrupt: the value under the key is not a
--                              record; nothing changed
--
-- The record (see README.md, Record layout) is a hash of one field while in
-- progress, h, the head:
--
--   <state><token length>:<token><epoch>:<lease end>:<fingerprint>
--
-- state "p" (in progress), "P" (in progress, and a waiter watches it: its
-- complete or release publishes) or "c" (complete). The lease end is a Unix
-- time in milliseconds on the server's clock (TIME), as redis-cli's TIME and
-- PEXPIRETIME read; the key expires at the later of the lease end and the
-- TTL deadline. A COMPLETE record adds one field named "c" followed by its
-- fingerprint, holding the payload (the Go side's encoding of status,
-- headers and body), so a replay is one HGET of the field its own
-- fingerprint names; its head keeps the token (for a retried complete), the
-- epoch and the last lease end, which nothing reads.
--
-- A retried call with the token that holds the record (same fingerprint)
-- gets {1, epoch} or {2, epoch} again, with the same epoch, and renews the
-- lease to run its full length from now when it would end sooner, whether
-- or not it had already run out: as long as no other token took the record
-- over, the holder keeps it, and never holds a lease that has run out. It
-- never shortens the lease.
--
-- The script has no flags line, unlike complete.lua: its replay, in-flight
-- and mismatch paths only read (the in-flight path marks the record as
-- watched when it can, see below), so they work on a server at maxmemory, and
-- its writes (a new record, a steal, a renewal) are refused there with an
-- OOM error, before anything is written.
--
-- Numbers are parsed strictly, since Lua's tonumber also accepts " 1",
-- "1.5", "1e3", "0x10", "nan" and "inf": the epoch and the lease end are 1
-- to 15 decimal digits without a leading zero, exact integers as Lua
-- numbers (doubles); the token length is 1 to 9 digits without a leading
-- zero and must fit in the head. Anything else is reported as {-1, ...}. A
-- replay reads the payload alone; the Go side decodes it strictly. A hash
-- without a head is not a record.

local key, cfp = KEYS[1], ARGV[1]

-- A replay: one read of the payload this request's fingerprint names, and
-- the key's PTTL only when the caller asked for it (the PTTL measured about
-- 1 µs, 15% of a replay's server time, and only a cache uses it).
-- redis.pcall returns an error as a table {err = message}; indexing a
-- string finds the string library, which has no err, so .err tells the two
-- apart without calling type() (a global look-up, measurably slower here).
local v = redis.pcall('HGET', key, cfp)
if v then
  if v.err then return {-1, 'key does not hold a hash: ' .. v.err} end
  if ARGV[5] then return {3, v, redis.call('PTTL', key)} end
  return {3, v}
end

-- Anything else: the whole record (HGET succeeded, so this is a hash or
-- nothing: no fields at all is no key, and a hash without a head is not a
-- record). A new key takes a lease ending ARGV[3] ms from the server's
-- TIME.
local a = redis.call('HGETALL', key)
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local tag, fp, lease_ms = ARGV[2], string.sub(cfp, 2), tonumber(ARGV[3])
if #a == 0 then
  redis.call('HSET', key, 'h', 'p' .. tag .. string.format('1:%d:', now + lease_ms) .. fp)
  redis.call('PEXPIRE', key, ARGV[4])
  return {1, 1}
end

-- head returns the head of a lease held by this caller: state s ("p" or
-- "P": a steal keeps the watched mark), epoch e and lease end d.
local function head(s, e, d)
  return s .. tag .. string.format('%d:%d:', e, d) .. fp
end

local max_epoch = 999999999999999 -- 15 digits

local h
for i = 1, #a, 2 do
  if a[i] == 'h' then h = a[i + 1] end
end
if not h then return {-1, 'field h is missing'} end

local tl, ti = string.match(h, '^[cpP]([1-9]%d*):()')
if not tl or #tl > 9 then return {-1, 'field h: malformed state or token length'} end
local te = ti + tl -- just after the token
local e, d, fi = string.match(h, '^([1-9]%d*):([1-9]%d*):()', te)
if not e or #e > 15 or #d > 15 then
  return {-1, 'field h: malformed epoch or lease end'}
end
local s = string.sub(h, 1, 1)
if string.sub(h, fi) ~= fp then
  return {5}
end
if s == 'c' then return {-1, 'field ' .. cfp .. ' (the payload) is missing'} end
local epoch, left = tonumber(e), tonumber(d) - now
if string.sub(h, 2, te - 1) == tag then
  -- A retry by the holder: the lease runs at least its length from now,
  -- and the key lives at least as long. The head first: a server at
  -- maxmemory refuses it before anything changed (PEXPIRE is not refused
  -- there).
  if left < lease_ms then
    redis.call('HSET', key, 'h', head(s, epoch, now + lease_ms))
    local pttl = redis.call('PTTL', key)
    if pttl >= 0 and pttl < lease_ms then redis.call('PEXPIRE', key, ARGV[3]) end
  end
  if epoch == 1 then return {1, epoch} end
  return {2, epoch}
end
if left <= 0 then
  if epoch >= max_epoch then return {-1, 'field h: the epoch is at its maximum'} end
  redis.call('HSET', key, 'h', head(s, epoch + 1, now + lease_ms))
  redis.call('PEXPIRE', key, ARGV[4])
  return {2, epoch + 1}
end
-- In flight: mark the record as watched, so that its complete or release
-- publishes. A waiter that watched the key while it was free (nothing to
-- mark then) and now finds another request's fresh record would otherwise
-- sleep until the holder's lease ends or its own bound. On a server at
-- maxmemory the mark is refused and skipped: the answer does not need it.
if s == 'p' then redis.pcall('HSET', key, 'h', 'P' .. string.sub(h, 2)) end
return {4, epoch, left}
