-- One page of a family's members put back in the due index (LaneStore.heal_derived, after
-- tick_heal.lua): a family of a million members is read a page a call, never in one. Each
-- page's members are read and indexed in one call, so a member removed meanwhile (its set and
-- its score go together, store/families.py) is never indexed again; one added meanwhile was
-- indexed by its adding. Only for the beat holding the lock.
-- KEYS[1] beat lock, KEYS[2] due index, KEYS[3] the family's member set
-- ARGV[1] beat token, ARGV[2] family name, ARGV[3] SSCAN cursor, ARGV[4] page,
-- ARGV[5] '1': every member due for a look now (the index is being rebuilt), '0': only the
-- members missing from the index
-- Returns {1, next cursor ('0': done), members read} or {0} if not the holder. A member set of
-- the wrong type reads as empty (its members are not indexed until it is fixed).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {0} end
local ok, got = pcall(redis.call, 'SSCAN', KEYS[3], ARGV[3], 'COUNT', ARGV[4])
if not ok then return {1, '0', 0} end
local members = got[2]
local step = 1000
for i = 1, #members, step do
  local args = {'ZADD', KEYS[2]}
  if ARGV[5] ~= '1' then args[#args + 1] = 'NX' end
  for j = i, math.min(i + step - 1, #members) do
    args[#args + 1] = 0; args[#args + 1] = ARGV[2] .. '[' .. members[j] .. ']'
  end
  redis.call(unpack(args))
end
return {1, got[1], #members}
