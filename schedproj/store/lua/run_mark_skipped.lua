-- A refused message (stale or missing lease token): set only the outcome fields of the run
-- record, atomically, so a run of the same lane finishing meanwhile is never rolled back.
-- KEYS[1] lanes hash, KEYS[2] wake list; ARGV[1] run field, ARGV[2] reason, ARGV[3] wake msg,
-- ARGV[4] the format of a record written from scratch (none stored: the caller's,
-- SCHEDPROJ_COMPACT_RECORDS), ARGV[5] longest the wake list may grow, ARGV[6] lane name;
-- KEYS[3] changed set (the lane is marked changed for beat); ARGV[7] the refused message's
-- task id ('' = not known): recorded as skipped_task_id, which ends that dispatch for beat at
-- once (views.is_in_flight), instead of holding the lane until its start deadline.
-- Returns 1 recorded, -1 the stored record is unreadable (left untouched).
-- Only those fields are set, in the record's text (record_field.lua): the rest stays exactly
-- as written (a cjson round trip cut every time to 10 ms). Records with or without the null
-- in-flight marks (the previous release's and this one's) are both read, and so are both
-- formats (record_format.lua): a stored record keeps its own, its fields named as it names
-- them; a record written from scratch (none stored) takes the format the caller was told.
-- include: record_field
-- include: record_format
local existing = redis.call('HGET', KEYS[1], ARGV[1])
local version, record = tonumber(ARGV[4]), nil
if existing then
  local ok, decoded = pcall(cjson.decode, existing)
  if not ok or type(decoded) ~= 'table' or not record_format_known(decoded.v) then return -1 end
  record, version = existing, decoded.v
elseif record_format_known(version) then
  record = '{"v":' .. record_number(version) .. '}'
else
  return redis.error_reply('ERR run_mark_skipped: record format ' .. tostring(ARGV[4])
                           .. ' is not one this release writes')
end
record = set_record_field(record, record_name(version, 'last_outcome'), '"skipped"')
record = set_record_field(record, record_name(version, 'last_reason'), cjson.encode(ARGV[2]))
if ARGV[7] and ARGV[7] ~= '' then
  record = set_record_field(record, record_name(version, 'skipped_task_id'),
                            cjson.encode(ARGV[7]))
end
redis.call('HSET', KEYS[1], ARGV[1], record)
redis.call('SADD', KEYS[3], ARGV[6])
redis.call('LPUSH', KEYS[2], ARGV[3])
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[5]) - 1)
return 1
