-- Release the beat lock only if the caller holds it. KEYS[1] lock; ARGV[1] token.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
