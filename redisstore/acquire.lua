-- acquire.lua: the acquire and steal edges. Looks the record up and, when
-- the caller may run the handler, takes a lease on it.
--
-- KEYS[1]  record key (a hash)
-- ARGV[1]  lease token of the caller
-- ARGV[2]  request fingerprint
-- ARGV[3]  lease, in milliseconds (> 0)
-- ARGV[4]  key expiry of a new lease, in milliseconds: the later of the
--          lease and the TTL (>= ARGV[3])
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
--
-- Redis formats and parses numbers with the C library, which costs more
-- than a field read. So the lease is written as TIME's own strings and the
-- caller's lease argument ("seconds:microseconds:lease_ms"), the expiry is
-- the caller's argument as it came, and numbers are parsed only on the paths
-- that compare them. An in-progress record's TTL deadline is its key's
-- expiry: when both it and the lease have passed, Redis has purged the key.

local key, token, fp = KEYS[1], ARGV[1], ARGV[2]

-- One read serves every case, and a replay needs nothing else.
local f = redis.pcall('HMGET', key, 'state', 'fp', 'epoch', 'meta', 'body', 'token', 'lease')
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

-- take writes a fresh lease at epoch e, taken at server time t.
local function take(e, t)
  redis.call('HSET', key, 'state', 'in_progress', 'token', token, 'fp', fp,
    'epoch', e, 'lease', t[1] .. ':' .. t[2] .. ':' .. ARGV[3])
  redis.call('PEXPIRE', key, ARGV[4])
end

if not state then
  if redis.call('EXISTS', key) == 1 then return {-1, 'field state is missing'} end
  take('1', redis.call('TIME'))
  return {1, 1}
end
if state ~= 'in_progress' then return {-1, 'field state holds an unknown value'} end
if not rfp then return {-1, 'field fp is missing'} end
if not epoch or epoch < 1 then return {-1, 'field epoch is missing or not a positive number'} end
local holder = f[6]
if not holder then return {-1, 'field token is missing'} end
local s, us, len = string.match(f[7] or '', '^(%d+):(%d+):(%d+)$')
if not s then return {-1, 'field lease is missing or malformed'} end

if rfp ~= fp then return {5} end
if holder == token then
  if epoch == 1 then return {1, epoch} end
  return {2, epoch}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease_at = tonumber(s) * 1000 + math.floor(tonumber(us) / 1000) + tonumber(len)
if now >= lease_at then
  take(epoch + 1, t)
  return {2, epoch + 1}
end
return {4, epoch, lease_at - now}
