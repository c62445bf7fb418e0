-- lua/run_finish.lua as the previous release (2a75607) shipped it, its includes spliced in: what a
-- worker of that release runs during a rolling deploy (tests/store/test_run_marks.py).
-- A run ends: record its outcome, release the lease by token, wake beat. Atomic.
-- KEYS[1] lease, KEYS[2] lanes hash, KEYS[3] wake list
-- ARGV[1] token ('' for light lanes), ARGV[2] run field, ARGV[3] run record JSON,
-- ARGV[4] fence of this run, ARGV[5] wake message, ARGV[6] '1' to write the record, '0' not,
-- ARGV[7] record format version, ARGV[8] longest the wake list may grow,
-- ARGV[9] the lane's next due time for the due index ('' = leave it), ARGV[10] lane name;
-- ARGV[11] '1' for a family member; KEYS[4] due index, KEYS[5] changed set (the lane is
-- marked changed for beat). written is -3 for a member removed meanwhile (nothing kept).
-- Returns {released, written}; written is 0 when a newer-fenced run already wrote the record
-- (a late writer), -1 when the stored record is unreadable (left untouched), -2 when not asked.
-- KEYS[6] due stamp, ARGV[12] stamp member: the due index is written (and its stamp bumped,
-- tick_stamp.lua) only while its stamp is trusted; else beat rebuilds it from the records.
-- Every check happens before the first write, so an error can never leave half a change.
-- Shared by every writer of the due index (spliced in with `-- include: tick_stamp`): the
-- index's write stamp. The index holds a stamp member whose score equals a separate counter;
-- a writer bumps both, but only while they agree, so an index deleted, emptied, replaced or
-- restored from an older copy keeps disagreeing until beat rebuilds it (tick_read.lua,
-- tick_heal.lua). due_ok says whether the index may be written at all (not a wrong type).
local function due_ok(due)
  local t = redis.call('TYPE', due)['ok']
  return t == 'zset' or t == 'none'
end
local function due_trusted(due, counter, member)
  local s = redis.pcall('ZSCORE', due, member)
  local c = redis.pcall('GET', counter)
  return type(s) == 'string' and type(c) == 'string' and tonumber(s) == tonumber(c)
end
local function bump_due_stamp(due, counter, member)
  if due_trusted(due, counter, member) then
    local n = redis.pcall('INCR', counter)
    if type(n) == 'number' then redis.call('ZADD', due, n, member) end
  end
end
local trusted = due_trusted(KEYS[4], KEYS[6], ARGV[12])
-- A light run (no token) whose record names another run in flight (one that started after it:
-- after a stalled heartbeat or a failover) records its outcome but leaves that run's in-flight
-- mark in place: ending one run must never make another invisible to beat.
local written = 1
if ARGV[6] ~= '1' then written = -2 end
local existing = redis.call('HGET', KEYS[2], ARGV[2])
if written == 1 and existing then
  local ok, rec = pcall(cjson.decode, existing)
  if not ok or type(rec) ~= 'table' or rec.v ~= tonumber(ARGV[7]) then
    written = -1
  else
    -- The numeric fields a reader relies on must be numbers (JSON null counts as wrong).
    for _, name in ipairs({'fence', 'runs', 'failures', 'backlog', 'last_run_at'}) do
      if rec[name] ~= nil and rec[name] ~= cjson.null and type(rec[name]) ~= 'number' then
        written = -1
      end
    end
    if rec.fence == cjson.null then written = -1 end
    if written == 1 and (rec.fence or 0) > tonumber(ARGV[4]) then written = 0 end
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
  local other = rec.running_task_id
  if ok and type(new) == 'table' and type(other) == 'string' and other ~= rec.last_task_id
      and other ~= new.last_task_id then
    for _, name in ipairs({'running_task_id', 'running_since', 'running_until'}) do
      local value = rec[name]
      local text = type(value) == 'number' and string.format('%.6f', value)
                   or cjson.encode(value)
      record = string.gsub(record, '"' .. name .. '":[^,}]*',
                           function() return '"' .. name .. '":' .. text end)
    end
  end
end
-- A family member removed while it ran leaves no record behind (ARGV[11] '1': a member).
if written == 1 and ARGV[11] == '1' and trusted and not redis.call('ZSCORE', KEYS[4], ARGV[10])
    then
  written = -3
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
