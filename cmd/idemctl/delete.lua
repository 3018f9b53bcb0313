-- delete.lua: deletes a record key for idemctl delete and release, but only
-- while it holds what idemctl read and judged (read.lua): its type and, for
-- a hash, the same fields with values of the same lengths, equal to those
-- read whole. A judgement made on a read is so never applied to a record
-- that changed since (a heartbeat, a takeover, a completion, a waiter's
-- mark). When the record was watched it then publishes on the record's
-- channel as release.lua does, so that waiters re-check at once.
--
-- KEYS[1]   record key
-- ARGV[1]   the key's type as read (TYPE)
-- ARGV[2]   the record's channel
-- ARGV[3]   the message to publish on it, or "" to publish nothing
-- ARGV[4..] for a hash: the number of its fields, then for each field its
--           name, the length of its value, and "=" followed by the value
--           when it was read whole ("" when only its length is compared)
--
-- Reply: 1 deleted, 0 changed since it was read (nothing deleted).

local key = KEYS[1]
if redis.call('TYPE', key)['ok'] ~= ARGV[1] then return 0 end
if ARGV[1] == 'hash' then
  if redis.call('HLEN', key) ~= tonumber(ARGV[4]) then return 0 end
  for i = 5, #ARGV, 3 do
    local v = redis.call('HGET', key, ARGV[i])
    if not v or #v ~= tonumber(ARGV[i + 1]) then return 0 end
    if ARGV[i + 2] ~= '' and '=' .. v ~= ARGV[i + 2] then return 0 end
  end
end
redis.call('DEL', key)
if ARGV[3] ~= '' then redis.call('PUBLISH', ARGV[2], ARGV[3]) end
return 1
