-- A refused message (stale or missing lease token): set only the outcome fields of the run
-- record, atomically, so a run of the same lane finishing meanwhile is never rolled back.
-- KEYS[1] lanes hash, KEYS[2] wake list; ARGV[1] run field, ARGV[2] reason, ARGV[3] wake msg
-- Returns 1 recorded, -1 the stored record is unreadable (left untouched).
local existing = redis.call('HGET', KEYS[1], ARGV[1])
local rec = {v = 1}
if existing then
  local ok, decoded = pcall(cjson.decode, existing)
  if not ok or type(decoded) ~= 'table' or decoded.v ~= 1 then return -1 end
  rec = decoded
end
rec.last_outcome = 'skipped'
rec.last_reason = ARGV[2]
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(rec))
redis.call('LPUSH', KEYS[2], ARGV[3])
redis.call('LTRIM', KEYS[2], 0, 63)
return 1
