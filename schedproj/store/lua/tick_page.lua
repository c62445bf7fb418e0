-- One further page of a tick's read that did not fit in one call (tick_read.lua returned a
-- continuation): the next lanes of the changed set kept aside, else the next due lanes, with
-- their records and index scores; the page that ends the read also reads what tick_read.lua
-- ends with (next look, lease, operator sets: after every lane's record, as in one call) and
-- deletes the set kept aside. Only for the beat holding the lock, whose TTL each page renews
-- (a read of many pages may outlast it).
-- KEYS[1] beat lock, KEYS[2] due index, KEYS[3] the changed set being read by pages,
-- KEYS[4] lanes hash, KEYS[5] lease, KEYS[6] paused, KEYS[7] run-now
-- ARGV[1] beat token, ARGV[2] lock ttl ms, ARGV[3] now, ARGV[4] stamp member, ARGV[5] page,
-- ARGV[6] changed cursor ('': no set kept aside; 'end': scanned, delete it at the end; else
-- the SSCAN cursor), ARGV[7...] the due continuation (member, score pairs; none: no more due)
-- Returns {1, names, n changed, values, scores, more, broken[, next look, lease, paused,
-- run-now]} (the last four when more is {}: the read is complete), or {0, holder} when the
-- lock is no longer this beat's: holder '' when no beat holds it (it vanished: Redis lost
-- its state mid-read, and no other beat took over), else the holder's token.
local holder = redis.call('GET', KEYS[1])
if holder ~= ARGV[1] then return {0, holder or ''} end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local STAMP = ARGV[4]
local PAGE = tonumber(ARGV[5])
local NOW = tonumber(ARGV[3])
-- include: tick_parts
local names, n_changed = {}, 0
local changed_cursor = ARGV[6]
local anchors = {}
for i = 7, #ARGV do anchors[#anchors + 1] = ARGV[i] end
if changed_cursor ~= '' and changed_cursor ~= 'end' then
  -- The set kept aside changes no more (only a read's first call adds to it): a scan of it
  -- returns each member, once or more.
  local got = redis.call('SSCAN', KEYS[3], changed_cursor, 'COUNT', PAGE)
  changed_cursor = got[1] == '0' and 'end' or got[1]
  for _, m in ipairs(got[2]) do
    if string.sub(m, 1, #STAMP) ~= STAMP then names[#names + 1] = m end
  end
  n_changed = #names
elseif #anchors > 0 then
  names, anchors = due_after(KEYS[2], anchors, NOW, PAGE, STAMP)
end
local due_type = redis.call('TYPE', KEYS[2])['ok']
local due_ok = due_type == 'zset' or due_type == 'none'
local values, scores = read_records(KEYS[4], KEYS[2], names, due_ok)
if not values then return {1, {}, 0, {}, {}, {}, broken} end
local more = {}
if (changed_cursor ~= '' and changed_cursor ~= 'end') or #anchors > 0 then
  more = {changed_cursor}
  for _, v in ipairs(anchors) do more[#more + 1] = v end
  return {1, names, n_changed, values, scores, more, broken}
end
-- UNLINK: a set of a million marks is freed off Redis's main thread.
if changed_cursor == 'end' then redis.call('UNLINK', KEYS[3]) end
local nxt, lease, paused, run_now = read_tail(KEYS[2], due_ok, ARGV[3], KEYS[5], KEYS[6],
                                              KEYS[7])
return {1, names, n_changed, values, scores, more, broken, nxt, lease, paused, run_now}
