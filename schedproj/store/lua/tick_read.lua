-- What one tick of the active beat reads: the lanes whose records changed since its last tick
-- (the changed set, emptied as it is read) and the lanes whose next look in the due index
-- came since then, with their records and index scores; plus the lease, the operator sets and
-- the index's next look after now. Only for the beat holding the lock (a standby consumes
-- nothing). KEYS[1] beat lock, KEYS[2] due index, KEYS[3] changed set, KEYS[4] lanes hash,
-- KEYS[5] lease, KEYS[6] paused, KEYS[7] run-now, KEYS[8] due stamp, KEYS[9] changed stamp
-- ARGV[1] beat token, ARGV[2] cursor (exclusive; '-inf': every due lane), ARGV[3] now,
-- ARGV[4] stamp member, ARGV[5...] lanes read every tick (gate blockers, due-check lanes)
-- Returns {1, names, n changed, values (run, sched per name), scores, next look, lease,
-- paused, run-now, broken} or {0}. broken lists key, problem pairs: a derived key ('stale':
-- its stamp disagrees with its counter, so it was deleted, emptied or restored from an older
-- copy; or 'wrong-type') beat must rebuild, or an operator key of the wrong type, read as
-- empty. A key of the wrong type never fails the read: one broken key stops only what
-- depends on it.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {0} end
local STAMP = ARGV[4]
local broken = {}
local function try(...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then
    return nil, r.err
  end
  return r
end
local function report(key, problem) broken[#broken + 1] = key; broken[#broken + 1] = problem end
-- The due index agrees with its counter (one ZSCORE and one GET: the idle tick stays cheap).
local due_ok = true
local idx_stamp, due_err = try('ZSCORE', KEYS[2], STAMP)
if due_err then
  due_ok = false; report(KEYS[2], 'wrong-type')
else
  local counter = try('GET', KEYS[8])
  if not idx_stamp or not counter or tonumber(idx_stamp) ~= tonumber(counter) then
    report(KEYS[2], 'stale')
  end
end
-- The changed set holds its generation's stamp member, else marks were lost.
local members, changed_err = try('SMEMBERS', KEYS[3])
local changed = {}
if changed_err then
  report(KEYS[3], 'wrong-type')
else
  local gen = try('GET', KEYS[9])
  local expect = STAMP .. ':' .. tostring(gen)
  local found = false
  for _, m in ipairs(members) do
    if m == expect then found = true
    elseif string.sub(m, 1, #STAMP) ~= STAMP then changed[#changed + 1] = m end
  end
  if not found then report(KEYS[3], 'stale') end
  -- Emptied as read, and stamped afresh (a stale set is reported once: beat heals it).
  if not found or #changed > 0 then
    local next_gen = try('INCR', KEYS[9])
    redis.call('DEL', KEYS[3])
    if next_gen then redis.call('SADD', KEYS[3], STAMP .. ':' .. next_gen) end
  end
end
local timely = {}
if due_ok then timely = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. ARGV[2], ARGV[3]) end
local seen, names = {}, {}
seen[STAMP] = true
local function add(list)
  for _, name in ipairs(list) do
    if not seen[name] then seen[name] = true; names[#names + 1] = name end
  end
end
add(changed)
local n_changed = #names
local always = {}
for i = 5, #ARGV do always[#always + 1] = ARGV[i] end
add(always)
add(timely)
local values, scores = {}, {}
local step = 500
for i = 1, #names, step do
  local fields, members_step = {}, {}
  for j = i, math.min(i + step - 1, #names) do
    fields[#fields + 1] = names[j] .. '|run'
    fields[#fields + 1] = names[j] .. '|sched'
    members_step[#members_step + 1] = names[j]
  end
  local got, lanes_err = try('HMGET', KEYS[4], unpack(fields))
  if lanes_err then
    -- No record can be read: read nothing (a lane read as never run would be dispatched).
    report(KEYS[4], 'wrong-type')
    return {1, {}, 0, {}, {}, '', '', {}, {}, broken}
  end
  for _, v in ipairs(got) do values[#values + 1] = v end
  for _, member in ipairs(members_step) do
    local s = due_ok and redis.call('ZSCORE', KEYS[2], member)
    scores[#scores + 1] = s or ''
  end
end
local nxt = {}
if due_ok then
  nxt = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. ARGV[3], '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
end
local function read_set(key)
  local got, err = try('SMEMBERS', key)
  if err then report(key, 'wrong-type'); return {} end
  return got
end
local lease, lease_err = try('GET', KEYS[5])
if lease_err then report(KEYS[5], 'wrong-type'); lease = '?' end
return {1, names, n_changed, values, scores, nxt[2] or '', lease or '',
        read_set(KEYS[6]), read_set(KEYS[7]), broken}
