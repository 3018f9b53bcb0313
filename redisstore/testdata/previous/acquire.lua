-- acquire.lua: the acquire and steal edges. Looks the record up and, when
-- the caller may run the handler, takes a lease on it.
--
-- KEYS[1]  record key (a hash)
-- ARGV[1]  lease token of the caller
-- ARGV[2]  request fingerprint
-- ARGV[3]  lease, in milliseconds (> 0, at most 13 digits)
-- ARGV[4]  key expiry of a new lease, in milliseconds: the later of the
--          lease and the TTL (>= ARGV[3])
--
-- Reply (always an array): a code, named by the Go constant after it (in
-- scripts.go; TestReplyCodes checks that the two agree), then data.
--   {1, epoch}                 acquireAcquired: no live record; fresh lease, epoch 1
--   {2, epoch}                 acquireStolen: the lease had expired; epoch + 1
--   {3, epoch, meta, body}     acquireCompleted: the stored payload, for replay
--   {4, epoch, remaining_ms}   acquireInFlight: another token's lease is live
--   {5}                        acquireMismatch: another fingerprint; nothing changed
--   {-1, message}              replyCorrupt: the value under the key is not a
--                              record; nothing changed
--
-- A retried call with the token that holds the record (same fingerprint)
-- gets {1, epoch} or {2, epoch} again, with the same epoch, and renews the
-- lease to run ARGV[3] from now when it would end sooner, whether or not it
-- had already run out: as long as no other token took the record over, the
-- holder keeps it, and never holds a lease that has run out. It never
-- shortens the lease. Only this script judges lease expiry, on the server's
-- clock (TIME, read at most once).
--
-- The script has no flags line, unlike complete.lua: its replay, in-flight
-- and mismatch paths only read (the in-flight path marks the record as
-- watched when it can, see below), so they work on a server at maxmemory, and
-- its writes (a new record, a steal, a renewal) are refused there with an
-- OOM error, before anything is written.
--
-- The lease field holds the lease's end: Unix time in milliseconds on the
-- clock of the server that wrote it (TIME), written with
-- string.format('%d', ...) because tostring turns numbers of 15 digits and
-- more into "1e+14" forms. The previous version of this store wrote
-- "seconds:microseconds:ms" instead (TIME when the lease was taken or
-- extended, and its length); an in-progress record it wrote may still be in
-- Redis during an upgrade, so that form is read too, and the lease then ends
-- at that time plus ms. The next write of the lease (a renewal, a steal, an
-- extend) replaces it with the new form.
--
-- Stored numbers are parsed strictly, since Lua's tonumber also accepts
-- " 1", "1.5", "1e3", "0x10", "nan" and "inf". Epoch is 1 to 15 decimal
-- digits without a leading zero (an exact integer as a Lua number, which is
-- a double). The lease's end is 1 to 15 decimal digits without a leading
-- zero: below 10^15 ms (the year 33658), so it and the server's time plus
-- the longest lease (13 digits, the longest Go duration in ms) stay exact
-- integers, far below 2^53. The previous form has 1 to 12, 1 to 6 and 1 to
-- 13 decimal digits, which keeps its sum below 2^53 too. Anything else is
-- reported as {-1, ...}.
--
-- An in-progress record's TTL deadline is its key's expiry: when both it and
-- the lease have passed, Redis has purged the key. The expiry is the
-- caller's argument as it came.

local key, token, fp = KEYS[1], ARGV[1], ARGV[2]

-- The largest epoch read: 15 digits. A steal of a record at this epoch is
-- refused rather than writing a 16th digit.
local max_epoch = 999999999999999

-- parse_epoch returns the epoch field as a number, or nil unless it is 1 to
-- 15 decimal digits without a leading zero.
local function parse_epoch(v)
  if not v or #v > 15 or not string.find(v, '^[1-9][0-9]*$') then return nil end
  return tonumber(v)
end

-- lease_end returns the end of the lease in the lease field v, in
-- milliseconds on the server's clock, or nil unless v is 1 to 15 decimal
-- digits without a leading zero, or the previous version's
-- "seconds:microseconds:ms" of 1 to 12, 1 to 6 and 1 to 13 decimal digits.
local function lease_end(v)
  if not v then return nil end
  if #v <= 15 and string.find(v, '^[1-9][0-9]*$') then return tonumber(v) end
  local s, us, len = string.match(v, '^([0-9]+):([0-9]+):([0-9]+)$')
  if not s or #s > 12 or #us > 6 or #len > 13 then return nil end
  return tonumber(s) * 1000 + math.floor(tonumber(us) / 1000) + tonumber(len)
end

-- now_ms returns the server's time (TIME) in whole Unix milliseconds.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- One read serves every case, and a replay needs nothing else.
local f = redis.pcall('HMGET', key, 'state', 'fp', 'epoch', 'meta', 'body', 'token', 'lease', 'watched')
if f['err'] then
  return {-1, 'key does not hold a hash: ' .. f['err']}
end
local state, rfp = f[1], f[2]
local epoch = parse_epoch(f[3])

if state == 'complete' then
  if not rfp then return {-1, 'field fp is missing'} end
  if not epoch then return {-1, 'field epoch is missing or not a positive integer of at most 15 digits'} end
  if rfp ~= fp then return {5} end
  if not f[4] then return {-1, 'field meta is missing'} end
  if not f[5] then return {-1, 'field body is missing'} end
  return {3, epoch, f[4], f[5]}
end

local lease_ms = tonumber(ARGV[3])

-- take writes a fresh lease at epoch e (a string), taken at server time now.
local function take(e, now)
  redis.call('HSET', key, 'state', 'in_progress', 'token', token, 'fp', fp,
    'epoch', e, 'lease', string.format('%d', now + lease_ms))
  redis.call('PEXPIRE', key, ARGV[4])
end

if not state then
  if redis.call('EXISTS', key) == 1 then return {-1, 'field state is missing'} end
  take('1', now_ms())
  return {1, 1}
end
if state ~= 'in_progress' then return {-1, 'field state holds an unknown value'} end
if not rfp then return {-1, 'field fp is missing'} end
if not epoch then return {-1, 'field epoch is missing or not a positive integer of at most 15 digits'} end
local holder = f[6]
if not holder then return {-1, 'field token is missing'} end
local lease_at = lease_end(f[7])
if not lease_at then return {-1, 'field lease is missing or malformed'} end

if rfp ~= fp then return {5} end
local now = now_ms()
if holder == token then
  -- A retry by the holder: the lease runs at least ARGV[3] from now, and
  -- the key lives at least as long (a key without expiry keeps none).
  if now + lease_ms > lease_at then
    redis.call('HSET', key, 'lease', string.format('%d', now + lease_ms))
    local pttl = redis.call('PTTL', key)
    if pttl >= 0 and pttl < lease_ms then
      redis.call('PEXPIRE', key, ARGV[3])
    end
  end
  if epoch == 1 then return {1, epoch} end
  return {2, epoch}
end
if now >= lease_at then
  if epoch >= max_epoch then return {-1, 'field epoch is at its maximum'} end
  take(string.format('%d', epoch + 1), now)
  return {2, epoch + 1}
end
-- In flight: mark the record as watched, so that its complete or release
-- publishes. A waiter that watched the key while it was free (nothing to
-- mark then) and now finds another request's fresh record would otherwise
-- sleep until the holder's lease ends or its own bound. On a server at
-- maxmemory the mark is refused and skipped: the answer does not need it.
if not f[8] then redis.pcall('HSET', key, 'watched', '1') end
return {4, epoch, lease_at - now}
