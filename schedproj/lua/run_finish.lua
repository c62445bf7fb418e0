-- A run ends: record its outcome, release the lease by token, wake beat. Atomic.
-- KEYS[1] lease, KEYS[2] lanes hash, KEYS[3] wake list
-- ARGV[1] token ('' for light lanes), ARGV[2] run field, ARGV[3] run record JSON,
-- ARGV[4] fence of this run, ARGV[5] wake message, ARGV[6] '1' to write the record, '0' not
-- Returns {released, written}; written is 0 when a newer-fenced run already wrote the record
-- (a late writer), -1 when the stored record is unreadable (left untouched), -2 when not asked.
-- Every check happens before the first write, so an error can never leave half a change.
local written = 1
if ARGV[6] ~= '1' then written = -2 end
local existing = redis.call('HGET', KEYS[2], ARGV[2])
if written == 1 and existing then
  local ok, rec = pcall(cjson.decode, existing)
  if not ok or type(rec) ~= 'table' or rec.v ~= 1 then
    written = -1
  else
    -- The numeric fields a reader relies on must be numbers (JSON null counts as wrong).
    for _, name in ipairs({'fence', 'runs', 'failures', 'backlog', 'last_run_at'}) do
      if rec[name] ~= nil and rec[name] ~= cjson.null and type(rec[name]) ~= 'number' then
        written = -1
      end
    end
    if rec.fence == cjson.null then written = -1 end
    if written == 1 and (rec.fence or 0) > tonumber(ARGV[4]) then written = 0 end
  end
end
local released = 0
if ARGV[1] ~= '' then
  local current = redis.call('GET', KEYS[1])
  if current then
    local ok, rec = pcall(cjson.decode, current)
    if ok and type(rec) == 'table' and rec.token == ARGV[1] then
      released = 1
    end
  end
end
if released == 1 then redis.call('DEL', KEYS[1]) end
if written == 1 then redis.call('HSET', KEYS[2], ARGV[2], ARGV[3]) end
redis.call('LPUSH', KEYS[3], ARGV[5])
redis.call('LTRIM', KEYS[3], 0, 63)
return {released, written}
