-- Rebuild the derived keys beat keeps beside the lane records: the due index and the changed
-- set (see tick_read.lua for how a broken one is detected). Only for the beat holding the lock.
-- The families' members are put in the index after this, a page a call (heal_page.lua): this
-- call's cost is the declared lanes', whatever the families hold.
-- KEYS[1] beat lock, KEYS[2] due index, KEYS[3] changed set, KEYS[4] due stamp,
-- KEYS[5] changed stamp
-- ARGV[1] beat token, ARGV[2] stamp member, ARGV[3] '1': every lane is due for a look now (the
-- index is rebuilt from nothing: beat re-reads every record and writes each lane's next look)
-- or '0': lanes missing from the index are added due now, the others keep their scores;
-- ARGV[4...] the declared lanes.
-- A key of the wrong type is deleted first. Returns -1 if not the holder, else 1.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local STAMP = ARGV[2]
local function keep_if(key, kind)
  local t = redis.call('TYPE', key)['ok']
  if t ~= 'none' and t ~= kind then redis.call('DEL', key) end
end
local function sane_counter(key)
  local ok, v = pcall(redis.call, 'GET', key)
  if not ok or (v and not string.match(v, '^%d+$')) or (v and #v > 15) then
    redis.call('DEL', key)
  end
end
keep_if(KEYS[2], 'zset'); keep_if(KEYS[3], 'set')
sane_counter(KEYS[4]); sane_counter(KEYS[5])
if ARGV[3] == '1' then redis.call('DEL', KEYS[2]) end
local lanes = {}
for i = 4, #ARGV do lanes[#lanes + 1] = ARGV[i] end
local step = 1000
for i = 1, #lanes, step do
  local args = {'ZADD', KEYS[2]}
  if ARGV[3] ~= '1' then args[#args + 1] = 'NX' end
  local n = 0
  for j = i, math.min(i + step - 1, #lanes) do
    args[#args + 1] = 0; args[#args + 1] = lanes[j]; n = n + 1
  end
  if n > 0 then redis.call(unpack(args)) end
end
redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[4]), STAMP)
redis.call('SADD', KEYS[3], STAMP .. ':' .. redis.call('INCR', KEYS[5]))
return 1
