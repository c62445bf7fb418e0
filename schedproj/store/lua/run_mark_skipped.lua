-- A refused message (stale or missing lease token): set only the outcome fields of the run
-- record, atomically, so a run of the same lane finishing meanwhile is never rolled back.
-- KEYS[1] lanes hash, KEYS[2] wake list; ARGV[1] run field, ARGV[2] reason, ARGV[3] wake msg,
-- ARGV[4] record format version, ARGV[5] longest the wake list may grow, ARGV[6] lane name;
-- KEYS[3] changed set (the lane is marked changed for beat); ARGV[7] the refused message's
-- task id ('' = not known): recorded as skipped_task_id, which ends that dispatch for beat at
-- once (views.is_in_flight), instead of holding the lane until its start deadline.
-- Returns 1 recorded, -1 the stored record is unreadable (left untouched).
-- Only those fields are set, in the record's text (record_field.lua): the rest stays exactly
-- as written (a cjson round trip cut every time to 10 ms). Records with or without the null
-- in-flight marks (the previous release's and this one's) are both read.
-- include: record_field
local existing = redis.call('HGET', KEYS[1], ARGV[1])
local version = tonumber(ARGV[4])
local record = '{"v":' .. record_number(version) .. '}'
if existing then
  local ok, decoded = pcall(cjson.decode, existing)
  if not ok or type(decoded) ~= 'table' or decoded.v ~= version then return -1 end
  record = existing
end
record = set_record_field(record, 'last_outcome', '"skipped"')
record = set_record_field(record, 'last_reason', cjson.encode(ARGV[2]))
if ARGV[7] and ARGV[7] ~= '' then
  record = set_record_field(record, 'skipped_task_id', cjson.encode(ARGV[7]))
end
redis.call('HSET', KEYS[1], ARGV[1], record)
redis.call('SADD', KEYS[3], ARGV[6])
redis.call('LPUSH', KEYS[2], ARGV[3])
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[5]) - 1)
return 1
