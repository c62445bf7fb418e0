-- What beat reads of the schedule entries due for a look: those whose next look is at or
-- before now (at most a limit, earliest first), with their stored states, and the operator's
-- paused and run-now sets (a run-now entry is read whether or not it is due).
-- KEYS[1] entries due index, KEYS[2] entries hash, KEYS[3] paused, KEYS[4] run-now
-- ARGV[1] now, ARGV[2] limit
-- Returns {names, values (false: none stored), paused, run-now, n marked, broken}: the first
-- n marked names have a next look of 0 or less (marked by an operator or a tool that wrote
-- outside beat: their stored state is the one to judge from); broken lists the operator sets
-- of the wrong type, read as empty (as the lanes' are: one bad key stops nothing else).
local broken = {}
local function set_or_empty(key)
  local got = redis.pcall('SMEMBERS', key)
  if type(got) == 'table' and got.err then broken[#broken + 1] = key; return {} end
  return got
end
local scored = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0,
                          ARGV[2])
local names, marked = {}, 0
for i = 1, #scored, 2 do
  names[#names + 1] = scored[i]
  if tonumber(scored[i + 1]) <= 0 then marked = marked + 1 end
end
local forced = set_or_empty(KEYS[4])
local seen = {}
for _, n in ipairs(names) do seen[n] = true end
for _, n in ipairs(forced) do
  if not seen[n] then seen[n] = true; names[#names + 1] = n end
end
local values = {}
if #names > 0 then values = redis.call('HMGET', KEYS[2], unpack(names)) end
return {names, values, set_or_empty(KEYS[3]), forced, marked, broken}
