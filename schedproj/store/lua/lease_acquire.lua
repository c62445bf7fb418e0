-- Grant the heavy lease if nobody holds it, with a new fencing number.
-- KEYS[1] lease, KEYS[2] fence counter, KEYS[3] beat lock (guard), KEYS[4] counters hash,
-- KEYS[5] epoch record (see epoch.lua), KEYS[6] (a pool's slot only) the pool's last fence
-- ARGV[1] token, ARGV[2] lane, ARGV[3] ttl ms, ARGV[4] now (s), ARGV[5] task id,
-- ARGV[6] beat token ('' = no guard: only for tests and operator tools), ARGV[7] beat's now
-- (ms; not used: see below),
-- ARGV[8] record format version, ARGV[9] name of the grants counter field
-- Each fence is at least the server's clock (TIME) in milliseconds, so fences keep
-- increasing even after Redis lost everything (a restart without persistence): a writer
-- holding a fence from before the loss can never outrank the holders that come after it. Never
-- from a beat host's clock: one running ahead would seed fences that a later beat (after the
-- next loss) could not reach, fencing the legitimate holder out in favour of an old one.
-- No lease is granted while the epoch says state may have been lost (missing, another server
-- process, or within its quarantine): an earlier holder may still be running. The grant is
-- stamped with the epoch's generation: lease_start.lua starts it only in that generation.
-- Returns {1, fence} granted, {0, holder lane} held, {-1, ''} caller is not the active beat,
-- {-2, ms left} quarantine (or epoch not established: run epoch.lua first).
-- The lease's text is written here, its numbers exactly (record_field.lua: cjson.encode keeps
-- 14 significant digits, which cut granted_at to 10 ms and a fence past 14 digits).
-- include: record_field
if ARGV[6] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[6] then
  return {-1, ''}
end
local raw_epoch = redis.call('GET', KEYS[5])
if not raw_epoch then return {-2, -1} end
local eok, epoch = pcall(cjson.decode, raw_epoch)
if not eok or type(epoch) ~= 'table' or type(epoch.quarantine_until) ~= 'number' then
  return {-2, -1}
end
local t = redis.call('TIME')
local server_now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') or '?'
if epoch.run_id ~= run_id then return {-2, -1} end
if server_now < epoch.quarantine_until then
  return {-2, epoch.quarantine_until - server_now}
end
-- Checked before anything is written (cjson refused it only once the fence had moved).
local granted_at = record_number(ARGV[4])
if not granted_at then
  return redis.error_reply('ERR lease_acquire: the grant time ' .. tostring(ARGV[4])
                           .. ' is not a finite number')
end
local current = redis.call('GET', KEYS[1])
if current then
  local ok, rec = pcall(cjson.decode, current)
  if ok and type(rec) == 'table' and rec.lane then
    return {0, tostring(rec.lane)}
  end
  return {0, '?'}
end
-- Never below the server's clock either: a failover to a replica that lacks the last grants
-- (or a restart from an old snapshot) brings back an older counter, which would hand out
-- fences already used before the loss.
local counter = redis.call('GET', KEYS[2])
local previous = 0
if counter then
  -- Garbage is refused, naming the key, never silently replaced: only digits, below 2^53 (a
  -- Lua number holds every integer up to it; '1e300' once came back as -2^63, and ran).
  if not string.match(counter, '^%d+$') or #counter > 16 or tonumber(counter) >= 2^53 then
    return redis.error_reply('ERR state at Redis key ' .. KEYS[2] .. ': the lease fence '
      .. 'counter holds ' .. string.format('%q', string.sub(counter, 1, 40)) .. ', not an '
      .. 'integer below 2^53; no heavy lease is granted. Fix: delete the key (fences start '
      .. 'again from the Redis clock in milliseconds, above every fence handed out)')
  end
  previous = tonumber(counter)
end
local fence = math.max(previous + 1, server_now)
-- A slot of a pool beyond the default also passes KEYS[6], the last fence granted in its pool:
-- fences are then distinct across the pool's slots too (two slots granted in the same
-- millisecond would otherwise share one), so a fence names one hold of the pool. Anything but
-- a number there counts as none (the slot's own counter and the clock still bound it).
if KEYS[6] then
  local last = tonumber(redis.call('GET', KEYS[6]) or '0') or 0
  if last ~= last or last >= 2^53 then last = 0 end
  fence = math.max(fence, last + 1)
  redis.call('SET', KEYS[6], string.format('%d', fence))
end
redis.call('SET', KEYS[2], string.format('%d', fence))
redis.call('HINCRBY', KEYS[4], ARGV[9], 1)
-- The fields cjson wrote before, in the order Python's encode gives them (no field is left
-- out but the epoch, when the epoch record has no generation).
local rec = '{"v":' .. record_number(tonumber(ARGV[8])) .. ',"lane":' .. cjson.encode(ARGV[2])
            .. ',"token":' .. cjson.encode(ARGV[1]) .. ',"fence":' .. record_number(fence)
            .. ',"granted_at":' .. granted_at .. ',"task_id":' .. cjson.encode(ARGV[5])
if type(epoch.gen) == 'number' then rec = rec .. ',"epoch":' .. record_number(epoch.gen) end
redis.call('SET', KEYS[1], rec .. '}', 'PX', ARGV[3])
return {1, fence}
