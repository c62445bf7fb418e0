-- A run ends: record its outcome, release the lease by token, wake beat. Atomic.
-- KEYS[1] lease, KEYS[2] lanes hash, KEYS[3] wake list
-- ARGV[1] token ('' for light lanes), ARGV[2] run field, ARGV[3] run record JSON,
-- ARGV[4] fence of this run, ARGV[5] wake message, ARGV[6] '1' to write the record, '0' not,
-- ARGV[7] the new record's format version (the stored one may be of either format this
-- release reads: record_format.lua), ARGV[8] longest the wake list may grow,
-- ARGV[9] the lane's next due time for the due index ('' = leave it), ARGV[10] lane name;
-- ARGV[11] '1' for a family member; KEYS[4] due index, KEYS[5] changed set (the lane is
-- marked changed for beat). written is -3 for a member removed meanwhile (nothing kept).
-- Returns {released, written}; written is 0 when a newer-fenced run already wrote the record
-- (a late writer), -1 when the stored record is unreadable (left untouched), -2 when not asked.
-- KEYS[6] due stamp, ARGV[12] stamp member: the due index is written (and its stamp bumped,
-- tick_stamp.lua) only while its stamp is trusted; else beat rebuilds it from the records.
-- Every check happens before the first write, so an error can never leave half a change.
-- include: tick_stamp
-- include: record_field
-- include: record_format
local trusted = due_trusted(KEYS[4], KEYS[6], ARGV[12])
-- A light run (no token) whose record names another run in flight (one that started after it:
-- after a stalled heartbeat or a failover) records its outcome but leaves that run's in-flight
-- mark in place: ending one run must never make another invisible to beat.
local written = 1
if ARGV[6] ~= '1' then written = -2 end
local existing = redis.call('HGET', KEYS[2], ARGV[2])
if written == 1 and existing then
  local ok, rec = pcall(cjson.decode, existing)
  if not ok or type(rec) ~= 'table' or not record_format_known(rec.v) then
    written = -1
  else
    -- The numeric fields a reader relies on must be numbers (JSON null counts as wrong).
    for _, name in ipairs({'fence', 'runs', 'failures', 'backlog', 'last_run_at'}) do
      local value = record_get(rec, name)
      if value ~= nil and value ~= cjson.null and type(value) ~= 'number' then
        written = -1
      end
    end
    local fence = record_get(rec, 'fence')
    if fence == cjson.null then written = -1 end
    if written == 1 and (fence or 0) > tonumber(ARGV[4]) then written = 0 end
  end
end
local released = 0
if ARGV[1] ~= '' then
  local current = redis.call('GET', KEYS[1])
  if current then
    local ok, rec = pcall(cjson.decode, current)
    if ok and type(rec) == 'table' and rec.token == ARGV[1] then
      released = 1
    end
  end
end
if released == 1 then redis.call('DEL', KEYS[1]) end
local record = ARGV[3]
if written == 1 and ARGV[1] == '' and existing then
  local _, rec = pcall(cjson.decode, existing)
  local ok, new = pcall(cjson.decode, ARGV[3])
  local other = record_get(rec, 'running_task_id')
  if ok and type(new) == 'table' and type(other) == 'string'
      and other ~= record_get(rec, 'last_task_id') and other ~= record_get(new, 'last_task_id')
      then
    -- Each mark copied, inserted where the finishing run's record leaves it out (null); a
    -- mark the stored record leaves out is null, and stays out where the new one does. Read
    -- by the stored record's format, written by the new one's (the two may differ mid-way
    -- through turning SCHEDPROJ_COMPACT_RECORDS on or off).
    for _, long in ipairs({'running_task_id', 'running_since', 'running_until'}) do
      local value, name = record_get(rec, long), record_name(new.v, long)
      if name and (value ~= nil or string.find(record, '"' .. name .. '":', 1, true)) then
        local text = type(value) == 'number' and string.format('%.6f', value)
                     or cjson.encode(value == nil and cjson.null or value)
        record = set_record_field(record, name, text)
      end
    end
  end
end
-- A family member removed while it ran leaves no record behind (ARGV[11] '1': a member).
if written == 1 and ARGV[11] == '1' and trusted and not redis.call('ZSCORE', KEYS[4], ARGV[10])
    then
  written = -3
end
-- Its record was kept only because this run was in flight (member_run_forget.lua): delete it,
-- unless it names another run in flight by now.
if written == -3 and existing then
  local ok, rec = pcall(cjson.decode, existing)
  local other = ok and type(rec) == 'table' and record_get(rec, 'running_task_id')
  if type(other) ~= 'string' or other == record_get(cjson.decode(ARGV[3]), 'last_task_id') then
    redis.call('HDEL', KEYS[2], ARGV[2])
  end
end
if written == 1 then
  redis.call('HSET', KEYS[2], ARGV[2], record)
  if ARGV[9] ~= '' and trusted and redis.call('ZSCORE', KEYS[4], ARGV[10]) then
    redis.call('ZADD', KEYS[4], ARGV[9], ARGV[10])
    bump_due_stamp(KEYS[4], KEYS[6], ARGV[12])
  end
end
redis.pcall('SADD', KEYS[5], ARGV[10])  -- a changed set of the wrong type: beat heals it
redis.call('LPUSH', KEYS[3], ARGV[5])
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[8]) - 1)
return {released, written}
