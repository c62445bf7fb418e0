-- Shared by the scripts that start or keep a run (lease_start, lease_renew, run_cas), spliced
-- in where a script says "-- include: epoch_refusal" (schedproj/store/scripts.py).
-- epoch_refusal(key): why no run may start or be re-asserted now (nil and the epoch record
-- when it may): 'epoch-unknown' (missing or unreadable), 'server-changed' (another server
-- process than the one the epoch names), 'quarantine' (within the state-loss quarantine).
local function epoch_refusal(key)
  local raw = redis.call('GET', key)
  if not raw then return 'epoch-unknown' end
  local ok, e = pcall(cjson.decode, raw)
  if not ok or type(e) ~= 'table' or type(e.quarantine_until) ~= 'number' then
    return 'epoch-unknown'
  end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if e.run_id ~= (string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') or '?') then
    return 'server-changed'
  end
  if now < e.quarantine_until then return 'quarantine' end
  return nil, e
end
