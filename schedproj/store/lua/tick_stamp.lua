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
