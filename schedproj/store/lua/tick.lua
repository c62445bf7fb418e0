-- One idle tick's whole Redis work in one script call: renew the beat lock (beat_lock.lua),
-- check the epoch (epoch.lua), read what changed (tick_read.lua). Each part is the very script
-- spliced in as a function, so each rule stays written once; one call instead of three costs
-- Redis one script invocation and the client one reply to parse, and a tick that changes
-- nothing is cheaper than a second beat that polls a due-time index (the scale benchmark's
-- yardstick). Running the three atomically only narrows what another client may do between
-- them.
-- KEYS[1] beat lock, KEYS[2] beat fence, KEYS[3] epoch record, KEYS[4] due index,
-- KEYS[5] changed set, KEYS[6] lanes hash, KEYS[7] lease, KEYS[8] paused, KEYS[9] run-now,
-- KEYS[10] due stamp, KEYS[11] changed stamp
-- ARGV[1] beat token, ARGV[2] lock ttl ms, ARGV[3] quarantine ms, ARGV[4] new epoch id,
-- ARGV[5] epoch record version, ARGV[6] cursor, ARGV[7] now, ARGV[8] stamp member,
-- ARGV[9...] lanes read every tick
-- Returns {beat_lock's reply, epoch's reply, tick_read's reply}; a lock reply event
-- 'bad-fence' when the beat fence is unusable.
local function beat_lock(KEYS, ARGV)
-- include: beat_lock
end
local function epoch(KEYS, ARGV)
-- include: epoch
end
local function tick_read(KEYS, ARGV)
-- include: tick_read
end
-- A beat fence that is not a sane integer cannot fence anything: take no lock, read nothing
-- (beat reports the key and dispatches nothing until it is deleted or fixed).
local fence = redis.pcall('GET', KEYS[2])
if type(fence) == 'table' or (fence and (not string.match(fence, '^%d+$') or #fence > 15)) then
  return {{0, '', 'bad-fence'}, {'', 0, 0, ''}, {0}}
end
-- A beat lock or epoch record of the wrong type was written by no beat: the lock is replaced
-- (as a lock without a TTL is), the epoch record counts as missing (a state loss: heavy
-- grants wait the quarantine, which beat reports).
for _, key in ipairs({KEYS[1], KEYS[3]}) do
  local t = redis.call('TYPE', key)['ok']
  if t ~= 'string' and t ~= 'none' then redis.call('DEL', key) end
end
local read_args = {ARGV[1], ARGV[6], ARGV[7], ARGV[8]}
for i = 9, #ARGV do read_args[#read_args + 1] = ARGV[i] end
return {beat_lock({KEYS[1], KEYS[2]}, {ARGV[1], ARGV[2]}),
        epoch({KEYS[3], KEYS[2]}, {ARGV[3], ARGV[4], ARGV[5]}),
        tick_read({KEYS[1], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9],
                   KEYS[10], KEYS[11]}, read_args)}
