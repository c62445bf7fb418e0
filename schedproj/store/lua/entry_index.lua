-- Rebuild the schedule entries' due index, only while the caller holds the beat lock: the
-- first call of a rebuild empties it, each call adds a chunk of entries (a rebuild of many
-- entries is several calls, so no single one holds Redis long).
-- KEYS[1] beat lock, KEYS[2] entries due index
-- ARGV[1] beat token, ARGV[2] '1' to empty the index first, then name/score pairs
-- Returns 1, or -1 if not the holder.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
if ARGV[2] == '1' then redis.call('DEL', KEYS[2]) end
for i = 3, #ARGV, 2 do redis.call('ZADD', KEYS[2], ARGV[i + 1], ARGV[i]) end
return 1
