-- Apply a list of REM store writes atomically, unless a newer fence has already written.
-- KEYS[1] the REM fence (highest fence seen); KEYS[2..] the keys the writes touch.
-- ARGV[1] fence: > 0 is checked against KEYS[1] and raises it; 0 is an unfenced light-lane
--   write (no check, fence untouched).
-- ARGV[2..] the writes, each as: command, key index (into KEYS), argument count, arguments...
-- Returns {1, fence stored} when applied, {0, fence stored} when refused (nothing written).
local allowed = {
  HSET = true, HDEL = true, HINCRBY = true, SADD = true, SREM = true, SET = true, DEL = true,
  INCR = true, RPUSH = true, LPUSH = true, LTRIM = true,
}
local fence = tonumber(ARGV[1])
if not fence or fence < 0 then
  return redis.error_reply('rem_fenced_write: bad fence ' .. tostring(ARGV[1]))
end
-- Validate every write before doing any, so a malformed list never leaves half a write.
local ops = {}
local i = 2
while i <= #ARGV do
  local cmd, k, n = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  if not allowed[cmd] then
    return redis.error_reply('rem_fenced_write: command not allowed: ' .. tostring(cmd))
  end
  if not k or k < 2 or k > #KEYS or not n or n < 0 or i + 2 + n > #ARGV then
    return redis.error_reply('rem_fenced_write: malformed write at argument ' .. i)
  end
  ops[#ops + 1] = {cmd, k, i + 3, i + 2 + n}
  i = i + 3 + n
end
local stored = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if fence > 0 then
  if fence < stored then return {0, stored} end
  if fence > stored then
    redis.call('SET', KEYS[1], fence)
    stored = fence
  end
end
for _, op in ipairs(ops) do
  redis.call(op[1], KEYS[op[2]], unpack(ARGV, op[3], op[4]))
end
return {1, stored}
