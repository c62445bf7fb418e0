-- A heavy run starts under its lease: only once per token, only while the token is current.
-- KEYS[1] lease; ARGV[1] token, ARGV[2] ttl ms, ARGV[3] now (s)
-- Returns {1, fence} or {0, reason} with reason gone | taken | already-started.
local current = redis.call('GET', KEYS[1])
if not current then return {0, 'gone'} end
local ok, rec = pcall(cjson.decode, current)
if not ok or type(rec) ~= 'table' then return {0, 'gone'} end
if rec.token ~= ARGV[1] then return {0, 'taken'} end
if rec.started_at then return {0, 'already-started'} end
rec.started_at = tonumber(ARGV[3])
redis.call('SET', KEYS[1], cjson.encode(rec), 'PX', ARGV[2])
return {1, rec.fence}
