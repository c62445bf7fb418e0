-- Write beat-owned lane fields and the due index together, only while the caller holds the
-- beat lock, so a beat that lost the lock cannot write. KEYS[1] lock, KEYS[2] lanes hash,
-- KEYS[3] due index, KEYS[4] due stamp. ARGV[1] beat token, ARGV[2] stamp member, ARGV[3]
-- number of field/value pairs, then the pairs, then lane/score pairs for the due index (a lane
-- no longer in the index, a removed family member, is not put back; an index of the wrong type
-- is left for beat to rebuild). Returns fields written, or -1 if not the holder.
-- include: tick_stamp
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local pairs_n = tonumber(ARGV[3])
local n = 0
for i = 4, 3 + 2 * pairs_n, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  n = n + 1
end
if 4 + 2 * pairs_n <= #ARGV and due_ok(KEYS[3]) then
  for i = 4 + 2 * pairs_n, #ARGV, 2 do
    if redis.call('ZSCORE', KEYS[3], ARGV[i]) then
      redis.call('ZADD', KEYS[3], ARGV[i + 1], ARGV[i])
    end
  end
  bump_due_stamp(KEYS[3], KEYS[4], ARGV[2])
end
return n
