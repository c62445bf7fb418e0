-- Replace a lane's run record only if it is still exactly what the caller read (compare and
-- set), so two writers never lose each other's change. The new record is computed by the
-- caller from the one it read (schedproj.core.lifecycle): one implementation of the rules.
-- KEYS[1] lanes hash, KEYS[2] beat fence counter
-- ARGV[1] run field, ARGV[2] expected raw value ('' = the field must be absent),
-- ARGV[3] new raw value, ARGV[4] sched field ('' = no dispatch check), ARGV[5] task id,
-- ARGV[6] beat fence the message carries ('' = no check), ARGV[7] lane name;
-- KEYS[3] changed set (the lane is marked changed for beat)
-- With a dispatch check (a light run starting), the message must come from the beat that holds
-- the lock now and be its lane's current dispatch (the task id the sched record names).
-- KEYS[4] epoch record: with a dispatch check, nothing starts while Redis may have lost state
-- (the check lease_acquire.lua makes); a message sent before a loss carries an older beat
-- fence (epoch.lua moves it on), so it is refused as stale-beat afterwards.
-- The sched record is read in either format, and the new record's mark is set under the name
-- its own format uses (record_format.lua).
-- ARGV[8] the in-flight mark's TTL in ms ('' = write the record as given): the new record's
-- running_until becomes the server's clock plus this TTL, so no worker's clock decides when a
-- light run's mark lapses (beat judges it with one TTL of grace).
-- Returns {1, ''} written or {0, reason}: changed | stale-beat | not-current-dispatch |
-- epoch-unknown | server-changed | quarantine.
-- The epoch check lease_acquire.lua makes: nil when state is known intact, else the reason.
-- include: epoch_refusal
-- include: record_field
-- include: record_format
if ARGV[6] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[6] then return {0, 'stale-beat'} end
if ARGV[4] ~= '' then
  local refusal = epoch_refusal(KEYS[4])
  if refusal then return {0, refusal} end
  local raw = redis.call('HGET', KEYS[1], ARGV[4])
  local ok, sched = false, nil
  if raw then ok, sched = pcall(cjson.decode, raw) end
  if not ok or type(sched) ~= 'table' or record_get(sched, 'inflight_task_id') ~= ARGV[5] then
    return {0, 'not-current-dispatch'}
  end
end
local current = redis.call('HGET', KEYS[1], ARGV[1])
if (current or '') ~= ARGV[2] then return {0, 'changed'} end
local record = ARGV[3]
if ARGV[8] and ARGV[8] ~= '' then
  local t = redis.call('TIME')
  local mark = string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1000000
                                     + tonumber(ARGV[8]) / 1000)
  -- Named as the new record's format names it (the sched record read above may be of the
  -- other format: record_format.lua).
  record = set_record_field(record, record_name(record_text_format(record), 'running_until')
                                    or 'running_until', mark)
end
redis.call('HSET', KEYS[1], ARGV[1], record)
redis.call('SADD', KEYS[3], ARGV[7])
return {1, ''}
