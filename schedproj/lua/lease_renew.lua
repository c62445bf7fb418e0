-- Renew the heavy lease by token, never past the maximum hold.
-- KEYS[1] lease; ARGV[1] token, ARGV[2] ttl ms, ARGV[3] now (s), ARGV[4] max hold (s)
-- Returns {1, ''} renewed or {0, reason} with reason lost | max-hold.
local current = redis.call('GET', KEYS[1])
if not current then return {0, 'lost'} end
local ok, rec = pcall(cjson.decode, current)
if not ok or type(rec) ~= 'table' or rec.token ~= ARGV[1] then return {0, 'lost'} end
local since = tonumber(rec.started_at or rec.granted_at)
if tonumber(ARGV[3]) - since >= tonumber(ARGV[4]) then return {0, 'max-hold'} end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, ''}
