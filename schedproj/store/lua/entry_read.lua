-- What beat reads of the schedule entries due for a look: those whose next look is at or
-- before now (at most a limit, earliest first), with their stored states, and the operator's
-- paused and run-now sets (a run-now entry is read whether or not it is due).
-- KEYS[1] entries due index, KEYS[2] entries hash, KEYS[3] paused, KEYS[4] run-now
-- ARGV[1] now, ARGV[2] limit
-- Returns {names, values (false: none stored), paused, run-now}
local names = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
local forced = redis.call('SMEMBERS', KEYS[4])
local seen = {}
for _, n in ipairs(names) do seen[n] = true end
for _, n in ipairs(forced) do
  if not seen[n] then seen[n] = true; names[#names + 1] = n end
end
local values = {}
if #names > 0 then values = redis.call('HMGET', KEYS[2], unpack(names)) end
return {names, values, redis.call('SMEMBERS', KEYS[3]), forced}
