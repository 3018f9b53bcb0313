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

local key = KEYS[1]
local token, fp = ARGV[1], ARGV[2]
local lease, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])

-- The server clock, read at most once and only when needed: a replay does
-- not need it, since a COMPLETE record's key expires exactly at its TTL
-- deadline and Redis treats an expired key as absent.
local now
local function clock()
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now
end

local function take(epoch)
  clock()
  local lease_at, expires_at = now + lease, now + ttl
  redis.call('HSET', key, 'state', 'in_progress', 'token', token, 'fp', fp,
    'epoch', epoch, 'lease_at', lease_at, 'expires_at', expires_at)
  redis.call('PEXPIREAT', key, math.max(lease_at, expires_at))
end

-- One read serves every case; a replay needs nothing else.
local f = redis.pcall('HMGET', key, 'state', 'token', 'fp', 'epoch', 'lease_at', 'expires_at', 'meta', 'body')
if f['err'] then
  return {-1, 'key does not hold a hash: ' .. f['err']}
end
local state, holder, rfp = f[1], f[2], f[3]
local epoch, lease_at, expires_at = tonumber(f[4]), tonumber(f[5]), tonumber(f[6])

if not state and redis.call('EXISTS', key) == 0 then
  take(1)
  return {1, 1}
end
if state ~= 'in_progress' and state ~= 'complete' then
  if state then
    return {-1, 'field state holds an unknown value'}
  end
  return {-1, 'field state is missing'}
end
if not rfp then return {-1, 'field fp is missing'} end
if not epoch or epoch < 1 then return {-1, 'field epoch is missing or not a positive number'} end
if not expires_at then return {-1, 'field expires_at is missing or not a number'} end

if state == 'complete' then
  if rfp ~= fp then return {5} end
  if not f[7] then return {-1, 'field meta is missing'} end
  if not f[8] then return {-1, 'field body is missing'} end
  return {3, epoch, f[7], f[8]}
end

if not holder then return {-1, 'field token is missing'} end
if not lease_at then return {-1, 'field lease_at is missing or not a number'} end
clock()
if now >= expires_at and now >= lease_at then
  -- Abandoned and past both TTL and lease: purged.
  redis.call('DEL', key)
  take(1)
  return {1, 1}
end
if rfp ~= fp then return {5} end
if holder == token then
  if epoch == 1 then return {1, epoch} end
  return {2, epoch}
end
if now >= lease_at then
  take(epoch + 1)
  return {2, epoch + 1}
end
return {4, epoch, lease_at - now}
