-- One idle tick's whole Redis work in one script call: renew the beat lock (beat_lock.lua),
-- check the epoch (epoch.lua), read what changed (tick_read.lua). Each part is the very script
-- spliced in as a function, so each rule stays written once; one call instead of three costs
-- Redis one script invocation and the client one reply to parse, and a tick that changes
-- nothing is cheaper than a second beat that polls a due-time index (the scale benchmark's
-- yardstick). Running the three atomically only narrows what another client may do between
-- them.
-- KEYS[1] beat lock, KEYS[2] beat fence, KEYS[3] epoch record, KEYS[4] due index,
-- KEYS[5] changed set, KEYS[6] lanes hash, KEYS[7] lease, KEYS[8] paused, KEYS[9] run-now,
-- KEYS[10] due stamp, KEYS[11] changed stamp, KEYS[12] the changed set being read by pages,
-- KEYS[13...] string keys read after the read (the due checks' stamps)
-- ARGV[1] beat token, ARGV[2] lock ttl ms, ARGV[3] quarantine ms, ARGV[4] new epoch id,
-- ARGV[5] epoch record version, ARGV[6] cursor, ARGV[7] now, ARGV[8] stamp member,
-- ARGV[9] page, ARGV[10] the server time (ms) this beat last saw another beat hold the lock,
-- while that was less than a lock TTL ago by its own clock ('0': not lately),
-- ARGV[11] the digest of the idle reply the caller holds ('': none), ARGV[12...] lanes read
-- every tick
-- Returns {beat_lock's reply, epoch's reply, tick_read's reply, KEYS[13...]'s values (MGET;
-- only when the read was made), the reply's digest ('' unless idle)}, or the server time (ms)
-- alone when the reply is idle and its digest is ARGV[11] (below); a lock reply event
-- 'bad-fence' when the beat fence is unusable, {0, '', 'deferred-after-loss'} when this beat
-- leaves a vacant lock to the beat it saw holding it (below).
local function beat_lock(KEYS, ARGV)
-- include: beat_lock
end
local function epoch(KEYS, ARGV)
-- include: epoch
end
local function tick_read(KEYS, ARGV)
-- include: tick_read
end
-- Nothing is checked before the lock and epoch scripts run (an idle tick stays as cheap as it
-- was); their errors and replies are: a beat fence that is not a sane positive integer cannot
-- fence anything, so no lock is taken and nothing read (beat reports the key and dispatches
-- nothing until it is deleted or fixed); a beat lock or epoch record of another type was
-- written by no beat, so the lock is replaced (as a lock without a TTL is) and the epoch
-- record counts as missing (a state loss: grants wait the quarantine, which beat reports).
local BAD_FENCE = {{0, '', 'bad-fence'}, {'', 0, 0, ''}, {0}}
local function fence_ok()
  local f = redis.pcall('GET', KEYS[2])
  return not (type(f) == 'table'
              or (f and (not string.match(f, '^%d+$') or #f > 15 or tonumber(f) < 1)))
end
local function sane(reply)
  local f = reply[2]
  return reply[1] ~= 1 or (type(f) == 'number' and f >= 1 and f == math.floor(f)
                           and f < 1e15 and reply[3] ~= nil)
end
-- The lanes hash, the lease, the due index, the changed set and their stamps tell an empty
-- Redis (a new deployment, or everything lost) from one that lost only part of its state.
local epoch_keys = {KEYS[3], KEYS[2], KEYS[6], KEYS[7], KEYS[4], KEYS[5], KEYS[10], KEYS[11]}
local epoch_args = {ARGV[3], ARGV[4], ARGV[5]}
local function checked_epoch()
  local ok_epoch, reply = pcall(epoch, epoch_keys, epoch_args)
  if not ok_epoch then
    if not fence_ok() then return nil end
    redis.call('DEL', KEYS[3])
    reply = epoch(epoch_keys, epoch_args)
  end
  return reply
end
local epoch_reply = nil
-- A vacant lock after a state loss vanished with the state: the beat that held it a moment ago
-- remembers the entries' states and the lanes' run records Redis lost, and puts them back when
-- it takes the lock again (beat.py _reread_all); a beat that takes it first remembers nothing,
-- so everything would count from now. So a beat that saw another hold the lock since the loss
-- was detected (the epoch record's since; a loss seen before that holder held the lock took
-- nothing from it) leaves the lock vacant: its caller stops asking one lock TTL after it last
-- saw the holder. A lock that expired with no loss since, or was never seen held, is taken at
-- once; a lock of another type or without a TTL is not vacant (replaced below, as ever).
local seen = tonumber(ARGV[10]) or 0
if seen > 0 and redis.call('EXISTS', KEYS[1]) == 0 then
  epoch_reply = checked_epoch()
  if not epoch_reply then return BAD_FENCE end
  local ok_rec, rec = pcall(cjson.decode, redis.call('GET', KEYS[3]))
  if ok_rec and type(rec) == 'table' and type(rec.since) == 'number' and rec.since >= seen then
    return {{0, '', 'deferred-after-loss'}, epoch_reply, {0}}
  end
end
local lock_keys, lock_args = {KEYS[1], KEYS[2]}, {ARGV[1], ARGV[2]}
local ok, lock = pcall(beat_lock, lock_keys, lock_args)
if not ok or not sane(lock) then
  if not fence_ok() then return BAD_FENCE end
  if not ok then
    redis.call('DEL', KEYS[1])
    lock = beat_lock(lock_keys, lock_args)
  end
end
if not epoch_reply then
  epoch_reply = checked_epoch()
  if not epoch_reply then return BAD_FENCE end
end
local read_args = {ARGV[1], ARGV[6], ARGV[7], ARGV[8], ARGV[9]}
for i = 12, #ARGV do read_args[#read_args + 1] = ARGV[i] end
local read = tick_read({KEYS[1], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9],
                        KEYS[10], KEYS[11], KEYS[12]}, read_args)
-- The stamps in the script, not in an MGET after it: the idle tick is one command, and its
-- client sends and parses no pipeline.
local got = {}
if #KEYS > 12 then got = redis.call('MGET', unpack(KEYS, 13)) end
-- The idle reply: the lock renewed, no loss, no lane read, no key broken, nothing left for
-- pages. Its digest covers every other part the caller parses (the fence, the epoch's id and
-- quarantine, the next look, the lease, the operator sets, the stamps and their keys); when
-- the caller holds the reply of that digest already, the server time (all that differs) is
-- the whole reply: the client of an idle tick parses one integer instead of some 25 elements,
-- and plans on the reply it parsed before, which this one would have repeated.
if lock[1] ~= 1 or lock[3] ~= 'renewed' or epoch_reply[4] ~= '' or read[1] ~= 1
    or #read[2] > 0 or #read[10] > 0 or #read[11] > 0 then
  return {lock, epoch_reply, read, got, ''}
end
local parts = {}
local function put(v)
  if v then parts[#parts + 1] = #v .. ':' .. v else parts[#parts + 1] = '-' end
end
put(tostring(lock[2])); put(epoch_reply[1]); put(tostring(epoch_reply[3])); put(read[6])
put(read[7])
for _, set in ipairs({read[8], read[9], got}) do
  parts[#parts + 1] = '#' .. #set
  for i = 1, #set do put(set[i]) end
end
for i = 13, #KEYS do put(KEYS[i]) end  -- the stamps' keys: their values are read by name
local digest = redis.sha1hex(table.concat(parts))
if digest == ARGV[11] then return epoch_reply[2] end
return {lock, epoch_reply, read, got, digest}
