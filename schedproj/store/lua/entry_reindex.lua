-- Heal the schedule entries' due index (it is derived: every defined entry has a next look),
-- only while the caller holds the beat lock: an index of the wrong type is deleted, each
-- entry missing from it is added due now, and a next look further off than the longest look
-- beat ever writes (moved by hand) is brought back to it; the other scores are kept. A heal of
-- many entries is several calls, so no single one holds Redis long.
-- KEYS[1] beat lock, KEYS[2] entries due index
-- ARGV[1] beat token, ARGV[2] now, ARGV[3] the latest next look kept, then entry names
-- Returns {-1} if not the holder, else {added, head name, head score, index size}.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-1} end
local t = redis.call('TYPE', KEYS[2])['ok']
if t ~= 'none' and t ~= 'zset' then redis.call('DEL', KEYS[2]) end
local now, latest = ARGV[2], tonumber(ARGV[3])
local added = 0
for i = 4, #ARGV do
  local score = redis.call('ZSCORE', KEYS[2], ARGV[i])
  if not score then
    redis.call('ZADD', KEYS[2], now, ARGV[i]); added = added + 1
  elseif tonumber(score) > latest then
    redis.call('ZADD', KEYS[2], ARGV[3], ARGV[i])
  end
end
local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
return {added, head[1] or '', head[2] or '', redis.call('ZCARD', KEYS[2])}
