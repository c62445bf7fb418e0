-- Detect that Redis lost state, and say how long no new heavy lease may be granted.
-- KEYS[1] epoch record, KEYS[2] beat fence counter, KEYS[3...] (optional) keys that earlier
-- schedproj state leaves behind (lane records, the lease, the due index and its stamps);
-- ARGV[1] quarantine (ms), ARGV[2] id for a new epoch, ARGV[3] record format version.
-- The epoch record names the Redis server process (its run_id) that holds this deployment's
-- state. It is missing after a restart without persistence, and names another run_id after a
-- restart or a failover to a replica that may lack the last writes. Either way a heavy run
-- whose lease key vanished may still be running, so a quarantine starts: until it ends no
-- lease is granted (lease_acquire.lua checks) while every earlier holder re-asserts its lease
-- at its next renewal or stops by its own rules. Time is the server's (TIME), so no host's
-- clock matters.
-- Every loss also starts a new generation (``gen``, never equal to an earlier one: at least the
-- server's clock in ms) and moves the beat fence on: a heavy grant is stamped with the
-- generation it was made in (lease_acquire.lua) and starts only in that generation
-- (lease_start.lua), and every message sent before the loss carries an older beat fence
-- (run_cas.lua refuses it), so nothing dispatched before a loss ever starts after it, even
-- from a broker that kept (or a replica that restored) the message.
-- Returns {epoch id, server now (ms), quarantine until (ms), cause}; cause is '' when nothing
-- changed, else (this call started the quarantine) 'server-changed', 'state-empty' (no epoch
-- record and none of KEYS[3...]: a new deployment, or a Redis that lost everything) or
-- 'state-missing' (no usable record while other state remains: keys evicted or deleted, a
-- garbled record; also whenever KEYS[3...] are not given, as nothing then shows emptiness).
-- The cause only tells what was seen: the quarantine is the same for each, because an empty
-- Redis is also what a restart without persistence leaves while a heavy run still holds the
-- lease it forgot, and nothing left in Redis can tell that from a first start.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') or '?'
local raw = redis.call('GET', KEYS[1])
local rec = nil
if raw then
  local ok, decoded = pcall(cjson.decode, raw)
  if ok and type(decoded) == 'table' and decoded.v == tonumber(ARGV[3])
      and type(decoded.quarantine_until) == 'number' then
    rec = decoded
  end
end
local cause = ''
if not rec then
  cause = 'state-missing'
  if not raw and #KEYS > 2 and redis.call('EXISTS', unpack(KEYS, 3)) == 0 then
    cause = 'state-empty'
  end
  rec = {v = tonumber(ARGV[3]), id = ARGV[2]}
elseif rec.run_id ~= run_id then
  cause = 'server-changed'
end
if cause ~= '' then
  rec.run_id = run_id
  rec.since = now
  rec.cause = cause
  rec.quarantine_until = now + tonumber(ARGV[1])
  rec.gen = math.max((tonumber(rec.gen) or 0) + 1, now)
  redis.call('SET', KEYS[1], cjson.encode(rec))
  if KEYS[2] then
    redis.call('SET', KEYS[2], now, 'NX')
    redis.call('INCR', KEYS[2])
  end
end
return {rec.id, now, rec.quarantine_until, cause}
