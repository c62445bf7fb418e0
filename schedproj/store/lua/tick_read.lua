-- What one tick of the active beat reads: the lanes whose records changed since its last tick
-- (the changed set, emptied as it is read) and the lanes whose next look in the due index
-- came since then, with their records and index scores; plus the lease, the operator sets and
-- the index's next look after now. Only for the beat holding the lock (a standby consumes
-- nothing). KEYS[1] beat lock, KEYS[2] due index, KEYS[3] changed set, KEYS[4] lanes hash,
-- KEYS[5] lease, KEYS[6] paused, KEYS[7] run-now, KEYS[8] due stamp, KEYS[9] changed stamp,
-- KEYS[10] the changed set being read by pages
-- ARGV[1] beat token, ARGV[2] cursor (exclusive; '-inf': every due lane), ARGV[3] now,
-- ARGV[4] stamp member, ARGV[5] page (most changed lanes, and most due lanes, one call
-- reads), ARGV[6...] lanes read every tick (gate blockers, due-check lanes)
-- Returns {1, names, n changed, values (run, sched per name), scores, next look, lease,
-- paused, run-now, broken, more} or {0}. broken lists key, problem pairs: a derived key
-- ('stale': its stamp disagrees with its counter, so it was deleted, emptied or restored from
-- an older copy; or 'wrong-type') beat must rebuild, or an operator key of the wrong type,
-- read as empty. A key of the wrong type never fails the read: one broken key stops only what
-- depends on it.
-- more is {} when this call read everything; else the read goes on by pages (tick_page.lua,
-- whose arguments more is): {changed cursor, due continuation...}. A changed set larger than
-- a page is renamed to KEYS[10] (a fresh, stamped changed set takes what changes from now on)
-- and scanned by pages; KEYS[10] is deleted only by the page that ends the read, so a beat
-- that stops mid-read loses no mark: the next read (by any beat) reads it first.
-- Due lanes beyond a page are read a page a call in index order.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {0} end
local STAMP = ARGV[4]
local PAGE = tonumber(ARGV[5])
-- include: tick_parts
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
-- A read by pages a beat left unfinished (it stopped, or lost the lock): read again now.
local changed, changed_cursor = {}, ''
local leftover, reading_err = try('EXISTS', KEYS[10])
if reading_err then leftover = 0 end
if leftover == 1 and redis.call('TYPE', KEYS[10])['ok'] ~= 'set' then
  -- Garbage where marks were kept: they are lost, as if the changed set were (beat heals).
  redis.call('DEL', KEYS[10]); report(KEYS[3], 'stale'); leftover = 0
end
if leftover == 1 then changed_cursor = '0' end
-- The changed set holds its generation's stamp member, else marks were lost.
local size, changed_err = try('SCARD', KEYS[3])
if changed_err then
  report(KEYS[3], 'wrong-type')
else
  local gen = try('GET', KEYS[9])
  local expect = STAMP .. ':' .. tostring(gen)
  local found = redis.call('SISMEMBER', KEYS[3], expect) == 1
  if not found then report(KEYS[3], 'stale') end
  -- A set of at most a page is read and emptied here; a larger one is kept aside (renamed:
  -- O(1)) and read by pages - unless a read left unfinished is kept aside already: that one
  -- is read first, and this set stays for the next tick's read.
  local consume = size <= PAGE + 2
  local renamed = false
  if leftover == 0 and not consume then
    redis.call('RENAME', KEYS[3], KEYS[10]); renamed = true; changed_cursor = '0'
  end
  if consume then
    for _, m in ipairs(redis.call('SMEMBERS', KEYS[3])) do
      if string.sub(m, 1, #STAMP) ~= STAMP then changed[#changed + 1] = m end
    end
  end
  -- Emptied as read, and stamped afresh (a stale set is reported once: beat heals it).
  if renamed or (consume and (not found or #changed > 0)) then
    local next_gen = try('INCR', KEYS[9])
    redis.call('DEL', KEYS[3])
    if next_gen then redis.call('SADD', KEYS[3], STAMP .. ':' .. next_gen) end
  end
end
local timely, due_more = {}, {}
if due_ok then
  -- One lane more than a page tells whether the due lanes fit: if not, this call reads the
  -- first page and the rest go on after its last lanes (tick_parts' due_after).
  local got = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. ARGV[2], ARGV[3], 'WITHSCORES',
                         'LIMIT', 0, PAGE + 1)
  local n = math.min(#got, 2 * PAGE)
  for i = 1, n, 2 do timely[#timely + 1] = got[i] end
  if #got > 2 * PAGE then
    for i = math.max(1, n - 2 * ANCHORS + 1), n do due_more[#due_more + 1] = got[i] end
  end
end
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
for i = 6, #ARGV do always[#always + 1] = ARGV[i] end
add(always)
add(timely)
local values, scores = read_records(KEYS[4], KEYS[2], names, due_ok)
if not values then
  -- No record can be read: read nothing (a lane read as never run would be dispatched).
  return {1, {}, 0, {}, {}, '', '', {}, {}, broken, {}}
end
local more = {}
if changed_cursor ~= '' or #due_more > 0 then
  more = {changed_cursor}
  for _, v in ipairs(due_more) do more[#more + 1] = v end
end
local nxt, lease, paused, run_now = read_tail(KEYS[2], due_ok, ARGV[3], KEYS[5], KEYS[6],
                                              KEYS[7])
return {1, names, n_changed, values, scores, nxt, lease, paused, run_now, broken, more}
