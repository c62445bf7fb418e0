-- Record the pools beyond the default that a beat declares, each at the most slots any beat
-- has declared it with (never lowered), and return every pool recorded: beat reads the slots
-- of earlier declarations too, so a run still holding a slot of a pool shrunk or removed by a
-- deploy is seen (it holds a place in its pool, and it is alive, not lost).
-- KEYS[1] the pools hash; ARGV: name, slots, name, slots, ...
-- Returns HGETALL of the hash (a field holding garbage is replaced by the declared count).
for i = 1, #ARGV, 2 do
  local current = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0') or 0
  if tonumber(ARGV[i + 1]) > current then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
return redis.call('HGETALL', KEYS[1])
