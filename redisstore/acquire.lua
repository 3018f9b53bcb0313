-- acquire.lua: the acquire and steal edges. Looks the record up and, when
-- the caller may run the handler, takes a lease on it.
--
-- KEYS[1]  record key (a hash)
-- ARGV[1]  lease token of the caller
-- ARGV[2]  request fingerprint
-- ARGV[3]  lease, in milliseconds (> 0)
-- ARGV[4]  TTL, in milliseconds (> 0)
--
-- Reply (always an array):
--   {1, epoch}                 acquired: no live record; fresh lease, epoch 1
--   {2, epoch}                 stolen: the lease had expired; epoch + 1
--   {3, epoch, meta, body}     completed: the stored payload, for replay
--   {4, epoch, remaining_ms}   in flight under another token's live lease
--   {5}                        mismatch: another fingerprint; nothing changed
--   {-1, message}              the value under the key is not a record
--
-- A retried call with the token that holds the record gets {1, epoch} or
-- {2, epoch} again. Only this script judges lease expiry, on the server's
-- clock (TIME, read at most once).

local key, token, fp = KEYS[1], ARGV[1], ARGV[2]

-- One read serves every case, and a replay needs nothing else. Numbers are
-- parsed only on the paths that use them: Redis formats and parses numbers
-- with the C library, which costs more than the read itself.
local f = redis.pcall('HMGET', key, 'state', 'fp', 'epoch', 'meta', 'body', 'token', 'lease_at', 'expires_at')
if f['err'] then
  return {-1, 'key does not hold a hash: ' .. f['err']}
end
local state, rfp = f[1], f[2]
local epoch = tonumber(f[3])

if state == 'complete' then
  if not rfp then return {-1, 'field fp is missing'} end
  if not epoch or epoch < 1 then return {-1, 'field epoch is missing or not a positive number'} end
  if rfp ~= fp then return {5} end
  if not f[4] then return {-1, 'field meta is missing'} end
  if not f[5] then return {-1, 'field body is missing'} end
  return {3, epoch, f[4], f[5]}
end

-- take writes a fresh lease at epoch e from now (ms on the server clock).
-- The key expires with the later of lease and TTL; PEXPIRE from the
-- request's own argument spares formatting a number, and its base time is
-- not earlier than now, so the key never expires before either deadline.
local function take(e, now)
  local lease, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
  redis.call('HSET', key, 'state', 'in_progress', 'token', token, 'fp', fp,
    'epoch', e, 'lease_at', now + lease, 'expires_at', now + ttl)
  redis.call('PEXPIRE', key, lease > ttl and ARGV[3] or ARGV[4])
end

local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

if not state then
  if redis.call('EXISTS', key) == 1 then return {-1, 'field state is missing'} end
  take(1, clock())
  return {1, 1}
end
if state ~= 'in_progress' then return {-1, 'field state holds an unknown value'} end
if not rfp then return {-1, 'field fp is missing'} end
if not epoch or epoch < 1 then return {-1, 'field epoch is missing or not a positive number'} end
local holder, lease_at, expires_at = f[6], tonumber(f[7]), tonumber(f[8])
if not expires_at then return {-1, 'field expires_at is missing or not a number'} end
if not holder then return {-1, 'field token is missing'} end
if not lease_at then return {-1, 'field lease_at is missing or not a number'} end

local now = clock()
if now >= expires_at and now >= lease_at then
  -- Abandoned and past both TTL and lease: purged.
  redis.call('DEL', key)
  take(1, now)
  return {1, 1}
end
if rfp ~= fp then return {5} end
if holder == token then
  if epoch == 1 then return {1, epoch} end
  return {2, epoch}
end
if now >= lease_at then
  take(epoch + 1, now)
  return {2, epoch + 1}
end
return {4, epoch, lease_at - now}
