-- Renew the heavy lease by token, never past the maximum hold; re-assert it if it vanished.
-- KEYS[1] lease, KEYS[2] fence counter, KEYS[3] pressure hash (its field 'current': what
-- beat last published; the holder learns it here, without another round trip)
-- ARGV[1] token, ARGV[2] ttl ms, ARGV[3] now (s), ARGV[4] max hold (s),
-- ARGV[5] the holder's lease record to re-assert ('' = do not), ARGV[6] the holder's fence,
-- ARGV[7] when the holder's run started (s); KEYS[4] epoch record (see epoch.lua)
-- A lease key that vanished means Redis lost state (a restart without persistence, a failover
-- to a replica without the last writes): the holder puts its lease back, unless a newer lease
-- was granted since (the fence counter moved past its fence) or another lease exists. Beat
-- grants nothing during the quarantine after a loss, which outlasts a renewal interval, so a
-- live holder always re-asserts before anyone else could be granted the lease.
-- The first holder to renew after a loss is not necessarily the legitimate one: a paused
-- zombie whose lease had already passed to a newer holder may resume first. So a re-asserted
-- lease is marked (the holder's record carries reasserted = true), and while the epoch says
-- state may have been lost (missing, another server process, or in quarantine) a re-assertion
-- with a higher fence replaces a re-asserted lower one; the displaced holder is told lost.
-- Returns {1, '', pressure} renewed, {1, 'reasserted', pressure}, or {0, reason} with reason
-- lost | max-hold; pressure is the 'current' field, or nil when there is none (or the key is
-- not a hash: garbage there must never cost the holder its lease).
-- KEYS[5] the pools hash, ARGV[8] the slot's pool ('' for the heavy lease), ARGV[9] its
-- index + 1: a renewing slot holder records that its pool has at least that many slots
-- (pools_declare.lua's rule, never lowered), so a slot past a shrunk pool stays known to beat
-- after the hash was lost with Redis's state or deleted. A hash beat cannot read (the wrong
-- type) is left alone: garbage there must never cost the holder its lease.
local function record_slot()
  if ARGV[8] == nil or ARGV[8] == '' then return end
  local ok, current = pcall(redis.call, 'HGET', KEYS[5], ARGV[8])
  if not ok then return end
  if (tonumber(current or '0') or 0) < tonumber(ARGV[9]) then
    redis.pcall('HSET', KEYS[5], ARGV[8], ARGV[9])
  end
end
local function pressure()
  if redis.call('TYPE', KEYS[3]).ok ~= 'hash' then return false end
  return redis.call('HGET', KEYS[3], 'current')
end
-- The epoch check lease_acquire.lua makes: nil when state is known intact, else the reason.
-- include: epoch_refusal
local current = redis.call('GET', KEYS[1])
if not current then
  if ARGV[5] == '' then return {0, 'lost'} end
  if tonumber(ARGV[3]) - tonumber(ARGV[7]) >= tonumber(ARGV[4]) then return {0, 'max-hold'} end
  local counter = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
  local fence = tonumber(ARGV[6])
  if counter > fence then return {0, 'lost'} end
  redis.call('SET', KEYS[1], ARGV[5], 'PX', ARGV[2])
  if counter < fence then redis.call('SET', KEYS[2], ARGV[6]) end
  record_slot()
  return {1, 'reasserted', pressure()}
end
local ok, rec = pcall(cjson.decode, current)
if ok and type(rec) == 'table' and rec.token ~= ARGV[1] and ARGV[5] ~= ''
    and rec.reasserted == true and tonumber(rec.fence) ~= nil
    and tonumber(ARGV[6]) > tonumber(rec.fence) and epoch_refusal(KEYS[4]) then
  -- A lower-fenced holder re-asserted first after the loss: the newer holder takes it back.
  if tonumber(ARGV[3]) - tonumber(ARGV[7]) >= tonumber(ARGV[4]) then return {0, 'max-hold'} end
  redis.call('SET', KEYS[1], ARGV[5], 'PX', ARGV[2])
  local counter = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
  if counter < tonumber(ARGV[6]) then redis.call('SET', KEYS[2], ARGV[6]) end
  record_slot()
  return {1, 'reasserted', pressure()}
end
if not ok or type(rec) ~= 'table' or rec.token ~= ARGV[1] then return {0, 'lost'} end
local since = tonumber(rec.started_at or rec.granted_at)
if tonumber(ARGV[3]) - since >= tonumber(ARGV[4]) then return {0, 'max-hold'} end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
record_slot()
return {1, '', pressure()}
