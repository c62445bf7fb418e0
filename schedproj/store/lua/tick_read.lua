-- What one tick of the active beat reads: the lanes whose records changed since its last tick
-- (the changed set, emptied as it is read) and the lanes whose next look in the due index
-- came since then, with their records and index scores; plus the lease, the operator sets and
-- the index's next look after now. Only for the beat holding the lock (a standby consumes
-- nothing). KEYS[1] beat lock, KEYS[2] due index, KEYS[3] changed set, KEYS[4] lanes hash,
-- KEYS[5] lease, KEYS[6] paused, KEYS[7] run-now
-- ARGV[1] beat token, ARGV[2] cursor (exclusive; '-inf': every due lane), ARGV[3] now,
-- ARGV[4...] lanes read every tick (gate blockers, due-check lanes)
-- Returns {1, names, n changed, values (run, sched per name), scores, next look, lease,
-- paused, run-now} or {0}.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {0} end
local changed = redis.call('SMEMBERS', KEYS[3])
if #changed > 0 then redis.call('DEL', KEYS[3]) end
local timely = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. ARGV[2], ARGV[3])
local seen, names = {}, {}
local function add(list)
  for _, name in ipairs(list) do
    if not seen[name] then seen[name] = true; names[#names + 1] = name end
  end
end
add(changed)
local n_changed = #names
local always = {}
for i = 4, #ARGV do always[#always + 1] = ARGV[i] end
add(always)
add(timely)
local values, scores = {}, {}
local step = 500
for i = 1, #names, step do
  local fields, members = {}, {}
  for j = i, math.min(i + step - 1, #names) do
    fields[#fields + 1] = names[j] .. '|run'
    fields[#fields + 1] = names[j] .. '|sched'
    members[#members + 1] = names[j]
  end
  local got = redis.call('HMGET', KEYS[4], unpack(fields))
  for _, v in ipairs(got) do values[#values + 1] = v end
  for _, member in ipairs(members) do
    local s = redis.call('ZSCORE', KEYS[2], member)
    scores[#scores + 1] = s or ''
  end
end
local nxt = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. ARGV[3], '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
return {1, names, n_changed, values, scores, nxt[2] or '', redis.call('GET', KEYS[5]) or '',
        redis.call('SMEMBERS', KEYS[6]), redis.call('SMEMBERS', KEYS[7])}
