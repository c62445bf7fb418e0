-- Grant the heavy lease if nobody holds it, with a new fencing number.
-- KEYS[1] lease, KEYS[2] fence counter, KEYS[3] beat lock (guard), KEYS[4] counters hash
-- ARGV[1] token, ARGV[2] lane, ARGV[3] ttl ms, ARGV[4] now (s), ARGV[5] task id,
-- ARGV[6] beat token ('' = no guard: only for tests and operator tools), ARGV[7] now (ms)
-- The fence counter starts from the clock in milliseconds, so fences keep increasing even
-- after Redis lost everything (a restart without persistence): a writer holding a fence from
-- before the loss can never outrank the holders that come after it.
-- Returns {1, fence} granted, {0, holder lane} held, {-1, ''} caller is not the active beat.
if ARGV[6] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[6] then
  return {-1, ''}
end
local current = redis.call('GET', KEYS[1])
if current then
  local ok, rec = pcall(cjson.decode, current)
  if ok and type(rec) == 'table' and rec.lane then
    return {0, tostring(rec.lane)}
  end
  return {0, '?'}
end
redis.call('SET', KEYS[2], ARGV[7], 'NX')
local fence = redis.call('INCR', KEYS[2])
redis.call('HINCRBY', KEYS[4], 'lease_acquisitions', 1)
local rec = {v = 1, lane = ARGV[2], token = ARGV[1], fence = fence,
             granted_at = tonumber(ARGV[4]), task_id = ARGV[5]}
redis.call('SET', KEYS[1], cjson.encode(rec), 'PX', ARGV[3])
return {1, fence}
