-- read.lua: reads a record key for idemctl, whatever it holds, in one round
-- trip and without changing it: its type, its expiry and, for a hash, every
-- field with the length of its value and at most the first ARGV[1] bytes of
-- it, so that a scan does not carry every stored body over the network.
-- idemctl decodes the fields (decodeRedis, record.go).
--
-- KEYS[1]  record key
-- ARGV[1]  the most bytes of each value to return (a positive integer)
--
-- Reply: {type, pttl, fields}: TYPE ("none" when there is no key), PTTL
-- (-1 without expiry, -2 without key) and, for a hash, an array of name,
-- length and value prefix, three entries a field, in HGETALL's order (an
-- empty array for another type).

local key, limit = KEYS[1], tonumber(ARGV[1])
local t = redis.call('TYPE', key)['ok']
local pttl = redis.call('PTTL', key)
local out = {}
if t == 'hash' then
  local a = redis.call('HGETALL', key)
  for i = 1, #a, 2 do
    local v = a[i + 1]
    out[#out + 1] = a[i]
    out[#out + 1] = #v
    out[#out + 1] = string.sub(v, 1, limit)
  end
end
return {t, pttl, out}
