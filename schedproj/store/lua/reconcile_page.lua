-- One slice of beat's periodic reconcile (LaneStore.reconcile_slice): a page of lanes - the
-- declared lanes given, or a page of a family's members by the SSCAN cursor heal_page.lua
-- uses - each put back in the due index if missing (due for a look now) and marked changed,
-- so the next tick reads its record whatever its score and writes its next look afresh. A
-- score moved by hand (far ahead, or behind the read's cursor) or a member removed from the
-- index is so put right within one cycle of slices; a score already right is left as it is
-- (the lane is read once more, nothing is written). Marks go to the changed set, never to a
-- paged read's aside set (KEYS[3] of tick_read.lua's KEYS[10]): nothing there is dropped.
-- A family's page is read and marked in one call, so a member removed meanwhile (its set and
-- its score go together, store/families.py) is never indexed again. Only for the beat holding
-- the lock.
-- KEYS[1] beat lock, KEYS[2] due index, KEYS[3] changed set, KEYS[4] the family's member set
-- (absent: the lanes are ARGV[5...])
-- ARGV[1] beat token, ARGV[2] family name, ARGV[3] SSCAN cursor, ARGV[4] page,
-- ARGV[5...] the lanes (without KEYS[4])
-- Returns {1, next cursor ('0': done), lanes marked} or {0} if not the holder. A key of the
-- wrong type is skipped: the next tick's read names it and beat heals it in full.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {0} end
local lanes, nxt = {}, '0'
if #KEYS >= 4 then
  local ok, got = pcall(redis.call, 'SSCAN', KEYS[4], ARGV[3], 'COUNT', ARGV[4])
  if ok then
    nxt = got[1]
    for _, m in ipairs(got[2]) do lanes[#lanes + 1] = ARGV[2] .. '[' .. m .. ']' end
  end
else
  for i = 5, #ARGV do lanes[#lanes + 1] = ARGV[i] end
end
local step = 1000
for i = 1, #lanes, step do
  local zadd, sadd = {'ZADD', KEYS[2], 'NX'}, {'SADD', KEYS[3]}
  for j = i, math.min(i + step - 1, #lanes) do
    zadd[#zadd + 1] = 0; zadd[#zadd + 1] = lanes[j]; sadd[#sadd + 1] = lanes[j]
  end
  redis.pcall(unpack(zadd))
  redis.pcall(unpack(sadd))
end
return {1, nxt, #lanes}
