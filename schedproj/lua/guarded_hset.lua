-- Write beat-owned lane fields only while the caller holds the beat lock, so a beat that lost
-- the lock cannot write. KEYS[1] lock, KEYS[2] lanes hash
-- ARGV[1] beat token, then field/value pairs. Returns fields written, or -1 if not the holder.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local n = 0
for i = 2, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  n = n + 1
end
return n
