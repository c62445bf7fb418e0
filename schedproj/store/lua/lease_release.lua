-- Release the heavy lease only if the caller's token is current.
-- KEYS[1] lease; ARGV[1] token. Returns 1 released, 0 not ours.
local current = redis.call('GET', KEYS[1])
if not current then return 0 end
local ok, rec = pcall(cjson.decode, current)
if ok and type(rec) == 'table' and rec.token == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
