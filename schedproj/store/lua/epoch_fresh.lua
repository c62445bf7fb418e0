-- Declare a fresh deployment: nothing ran before on this state, so no quarantine is needed.
-- Refused when any lane state or a lease exists (then state was not lost: nothing to skip),
-- and when any epoch record exists: a beat already ran on this state, and after an empty
-- restart its record is what holds the quarantine that protects runs that may still hold a
-- lease (their lease and lane state are exactly what the restart lost).
-- KEYS[1] epoch record, KEYS[2] lanes hash, KEYS[3] lease; ARGV[1] epoch id, ARGV[2] version
-- Returns 1 declared, 0 refused.
if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('EXISTS', KEYS[2]) == 1
    or redis.call('EXISTS', KEYS[3]) == 1 then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') or '?'
redis.call('SET', KEYS[1], cjson.encode({v = tonumber(ARGV[2]), id = ARGV[1], run_id = run_id,
  since = now, cause = 'fresh', quarantine_until = now, gen = now}))
return 1
