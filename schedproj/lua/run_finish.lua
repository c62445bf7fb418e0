-- A run ends: record its outcome, release the lease by token, wake beat. Atomic.
-- KEYS[1] lease, KEYS[2] lanes hash, KEYS[3] wake list
-- ARGV[1] token ('' for light lanes), ARGV[2] run field, ARGV[3] run record JSON,
-- ARGV[4] fence of this run, ARGV[5] wake message
-- Returns {released, written}; written is 0 when a newer-fenced run already wrote the record
-- (a late writer), -1 when the stored record is unreadable (left untouched).
local released = 0
if ARGV[1] ~= '' then
  local current = redis.call('GET', KEYS[1])
  if current then
    local ok, rec = pcall(cjson.decode, current)
    if ok and type(rec) == 'table' and rec.token == ARGV[1] then
      redis.call('DEL', KEYS[1])
      released = 1
    end
  end
end
local written = 1
local existing = redis.call('HGET', KEYS[2], ARGV[2])
if existing then
  local ok, rec = pcall(cjson.decode, existing)
  if not ok or type(rec) ~= 'table' then
    written = -1
  elseif tonumber(rec.fence or 0) > tonumber(ARGV[4]) then
    written = 0
  end
end
if written == 1 then redis.call('HSET', KEYS[2], ARGV[2], ARGV[3]) end
redis.call('LPUSH', KEYS[3], ARGV[5])
redis.call('LTRIM', KEYS[3], 0, 63)
return {released, written}
