-- Record a run as lost: it started, and its lease (heavy) or in-flight mark (light) lapsed
-- without an end being recorded (its worker was killed, say). Compare and set on the record
-- the caller read, and for a heavy run only while no lease names that run: a run that is
-- finishing at this very moment is never marked lost.
-- KEYS[1] lanes hash, KEYS[2] the run's lease (the heavy lease, or the first slot lease of
-- the run's pool), KEYS[6..] the pool's other slot leases (none for the default pool): a pool
-- run is alive while any slot of its pool names it (a run holding k slots is judged on all of
-- them: its end releases them one by one, the last with its record); ARGV[1] run field, ARGV[2] expected raw value ('' =
-- the field must be absent: Redis lost it), ARGV[3] new raw value, ARGV[4] the lost run's
-- task id, ARGV[5] '1' for a heavy run, ARGV[6] lane name; KEYS[3] changed set (the lane is
-- marked changed for beat), KEYS[4] due index, KEYS[5] epoch record.
-- Nothing is recorded while Redis may have lost state since the caller read (beat judges
-- after the quarantine, on what it reads then), and an absent record is written only for a
-- lane still in the due index (a removed family member's state stays gone).
-- Returns 1 recorded, 0 not (the record changed, the run's lease is alive, state may be lost,
-- or the lane is gone).
-- include: epoch_refusal
if epoch_refusal(KEYS[5]) then return 0 end
local current = redis.call('HGET', KEYS[1], ARGV[1])
if (current or '') ~= ARGV[2] then return 0 end
if not current and not redis.call('ZSCORE', KEYS[4], ARGV[6]) then return 0 end
if ARGV[5] == '1' then
  for i = 2, #KEYS do
    if i == 2 or i > 5 then
      local raw = redis.call('GET', KEYS[i])
      if raw then
        local ok, lease = pcall(cjson.decode, raw)
        if not ok or type(lease) ~= 'table' or lease.task_id == ARGV[4] then return 0 end
      end
    end
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('SADD', KEYS[3], ARGV[6])
return 1
