-- Write schedule entries' states and their next looks, each compared and set, only while the
-- caller holds the beat lock: a beat that lost its lock writes nothing, and of two beats that
-- read one due time only the first claim lands, so a due time is sent at most once.
-- KEYS[1] beat lock, KEYS[2] entries hash, KEYS[3] entries due index, KEYS[4] run-now set,
-- KEYS[5] the entries' listing (``entries:info``: only its size is read)
-- ARGV[1] beat token, ARGV[2] the marker for "no value", ARGV[3] the marker for "any value",
-- then groups of five: name, expected value (the first marker: none stored; the second:
-- whatever is stored; ignored for a look), new value, score, run-now ('clear': the write is
-- a run an operator asked for, which it answers; 'force': it undoes one, asked again; '')
-- A new value that is the marker deletes the entry (state and index); an empty new value
-- only moves its next look, and only if it is still in the index (a removed entry stays out).
-- The run-now mark moves with the claim that answers it, atomically: a beat killed after the
-- send cannot leave it to be sent again, and a claim that did not land leaves it asked.
-- Returns {-1} without the lock, else {results..., head name, head score, index size, listing
-- size (-1: not a hash)}, each result 1 (written) or 0 (the stored value was not the expected
-- one: another beat or an operator wrote it since it was read).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-1} end
local NONE, ANY = ARGV[2], ARGV[3]
local out = {}
for i = 4, #ARGV, 5 do
  local name, expected, value, score = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local run_now = ARGV[i + 4]
  if value == '' then
    if redis.call('ZSCORE', KEYS[3], name) then redis.call('ZADD', KEYS[3], score, name) end
    out[#out + 1] = 1
  else
    local stored = redis.call('HGET', KEYS[2], name)
    if expected ~= ANY and (stored or NONE) ~= expected then
      out[#out + 1] = 0
    elseif value == NONE then
      redis.call('HDEL', KEYS[2], name)
      redis.call('ZREM', KEYS[3], name)
      redis.pcall('SREM', KEYS[4], name)
      out[#out + 1] = 1
    else
      redis.call('HSET', KEYS[2], name, value)
      redis.call('ZADD', KEYS[3], score, name)
      -- A run-now set of the wrong type is read as empty (entry_read.lua): never fail on it.
      if run_now == 'clear' then redis.pcall('SREM', KEYS[4], name)
      elseif run_now == 'force' then redis.pcall('SADD', KEYS[4], name) end
      out[#out + 1] = 1
    end
  end
end
local head = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
out[#out + 1] = head[1] or ''
out[#out + 1] = head[2] or ''
out[#out + 1] = redis.call('ZCARD', KEYS[3])
local listed = redis.pcall('HLEN', KEYS[5])
out[#out + 1] = type(listed) == 'number' and listed or -1
return out
