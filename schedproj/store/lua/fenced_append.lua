-- Append to a ledger only if no newer fence has written: a late writer is refused.
-- KEYS[1] highest fence seen, KEYS[2] ledger list, KEYS[3] refusals counter
-- ARGV[1] fence, ARGV[2] entry. Returns 1 appended, 0 refused.
local seen = tonumber(redis.call('GET', KEYS[1]) or '0')
local fence = tonumber(ARGV[1])
if fence < seen then
  redis.call('INCR', KEYS[3])
  return 0
end
if fence > seen then redis.call('SET', KEYS[1], ARGV[1]) end
redis.call('RPUSH', KEYS[2], ARGV[2])
return 1
