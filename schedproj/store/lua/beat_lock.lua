-- Take or renew the single-active-beat lock.
-- KEYS[1] lock, KEYS[2] beat fence counter; ARGV[1] token, ARGV[2] ttl ms
-- Returns {1, fence, 'acquired' | 'renewed'} or {0, holder token, 'held'}.
-- The fence counter starts from the server clock in milliseconds, so it keeps increasing even
-- after Redis lost everything: a message carrying an older beat's fence never matches again.
local t = redis.call('TIME')
redis.call('SET', KEYS[2], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), 'NX')
local current = redis.call('GET', KEYS[1])
if not current then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  local fence = redis.call('INCR', KEYS[2])
  return {1, fence, 'acquired'}
end
if redis.call('PTTL', KEYS[1]) == -1 then
  -- No beat writes a lock without a TTL: this is garbage that would block every beat
  -- forever. Replace it (the caller logs that it did).
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  local fence = redis.call('INCR', KEYS[2])
  return {1, fence, 'replaced-garbage'}
end
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(redis.call('GET', KEYS[2]) or 0), 'renewed'}
end
return {0, current, 'held'}
