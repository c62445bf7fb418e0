-- What tick_read.lua (a tick's first call) and tick_page.lua (each further page of a read too
-- large for one call) share, spliced into both: broken-key reports, the records of a list of
-- lanes, the due lanes after a position in the index, and what a read ends with.
local broken = {}
local function try(...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then
    return nil, r.err
  end
  return r
end
local function report(key, problem) broken[#broken + 1] = key; broken[#broken + 1] = problem end
-- The run and sched records of ``names`` (HMGET, 500 lanes a command) and their due-index
-- scores ('' when not in it; all '' when the index is unusable). nil when the lanes hash
-- cannot be read (reported).
local function read_records(lanes_key, due_key, names, due_ok)
  local values, scores = {}, {}
  local step = 500
  for i = 1, #names, step do
    local fields, members_step = {}, {}
    for j = i, math.min(i + step - 1, #names) do
      fields[#fields + 1] = names[j] .. '|run'
      fields[#fields + 1] = names[j] .. '|sched'
      members_step[#members_step + 1] = names[j]
    end
    local got, lanes_err = try('HMGET', lanes_key, unpack(fields))
    if lanes_err then
      report(lanes_key, 'wrong-type')
      return nil
    end
    for _, v in ipairs(got) do values[#values + 1] = v end
    for _, member in ipairs(members_step) do
      local s = due_ok and redis.call('ZSCORE', due_key, member)
      scores[#scores + 1] = s or ''
    end
  end
  return values, scores
end
-- How many of a page's last due lanes are handed back as its continuation (member, score
-- pairs): the next page starts after the latest of them still at the score it was read at.
local ANCHORS = 4
-- The due lanes (score <= now) after the index position ``anchors`` names, at most ``page``;
-- and the continuation ({} when the index holds no due lane after them). The position is a
-- lane read last, still at its score (ZRANK: the index orders by score, then name); one that
-- moved since (a run ended, an operator asked for a look) falls back to the one before it,
-- and when all moved, to the first lane at the last one's score: lanes read again are read
-- twice (beat keeps the later), none is skipped. A lane moved to before the position since is
-- in the changed set, which the next tick reads.
local function due_after(due_key, anchors, now, page, stamp)
  local start
  for i = #anchors - 1, 1, -2 do
    local s = redis.call('ZSCORE', due_key, anchors[i])
    if s and tonumber(s) == tonumber(anchors[i + 1]) then
      start = redis.call('ZRANK', due_key, anchors[i]) + 1
      break
    end
  end
  if not start then
    start = redis.call('ZCOUNT', due_key, '-inf', '(' .. anchors[#anchors])
  end
  local got = redis.call('ZRANGE', due_key, start, start + page - 1, 'WITHSCORES')
  local names, more = {}, {}
  local complete = #got < 2 * page
  for i = 1, #got, 2 do
    local score = tonumber(got[i + 1])
    if not score or score > now then complete = true; break end
    if got[i] ~= stamp then names[#names + 1] = got[i] end
    more[#more + 1] = got[i]; more[#more + 1] = got[i + 1]
  end
  if complete then return names, {} end
  local last = {}
  for i = math.max(1, #more - 2 * ANCHORS + 1), #more do last[#last + 1] = more[i] end
  return names, last
end
local function read_set(key)
  local got, err = try('SMEMBERS', key)
  if err then report(key, 'wrong-type'); return {} end
  return got
end
-- What a read ends with, read after every lane's record: the index's next look after now, the
-- lease and the operator sets.
local function read_tail(due_key, due_ok, now, lease_key, paused_key, run_now_key)
  local nxt = {}
  if due_ok then
    nxt = redis.call('ZRANGEBYSCORE', due_key, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  end
  local lease, lease_err = try('GET', lease_key)
  if lease_err then report(lease_key, 'wrong-type'); lease = '?' end
  return nxt[2] or '', lease or '', read_set(paused_key), read_set(run_now_key)
end
