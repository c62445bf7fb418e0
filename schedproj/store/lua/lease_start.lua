-- A heavy run starts under its lease: only once per token, only while the token is current,
-- and only if the message comes from the beat that holds the beat lock now.
-- KEYS[1] lease, KEYS[2] beat fence counter, KEYS[3] epoch record (see epoch.lua)
-- ARGV[1] token, ARGV[2] ttl ms, ARGV[3] now (s), ARGV[4] the beat fence the message carries
-- ('' = not checked: tests and operator tools),
-- ARGV[5] holder host, ARGV[6] holder pid, ARGV[7] holder worker node name,
-- ARGV[8] the lane the worker runs, ARGV[9] its message's task id ('' = not checked: tests
-- and operator tools)
-- A token is the grant of one message of one lane: a hand-made message for another lane (or
-- another task id) that carries it starts nothing and leaves the grant to its own message.
-- A message from a beat that has since lost its lock (frozen between recording and sending,
-- say) starts nothing, and frees the lease it was granted so the current beat can grant again.
-- The holder's identity lets a worker restarted on the same node free the lease of a
-- predecessor it can prove dead.
-- Nothing starts while Redis may have lost state (the same check as lease_acquire.lua: epoch
-- missing, another server process, or in quarantine), nor under a grant made in an earlier
-- epoch generation (before a loss: a failover to a replica that has the grant and the message
-- but not the start would otherwise run the message a second time). These refusals leave the
-- lease alone: a run that started before the loss may hold it.
-- Returns {1, fence} or {0, reason} with reason gone | taken | wrong-lane | wrong-task |
-- already-started | stale-beat | epoch-unknown | server-changed | quarantine | stale-epoch.
-- The epoch check lease_acquire.lua makes: nil when state is known intact, else the reason.
-- include: epoch_refusal
local current = redis.call('GET', KEYS[1])
if not current then return {0, 'gone'} end
local ok, rec = pcall(cjson.decode, current)
if not ok or type(rec) ~= 'table' then return {0, 'gone'} end
if rec.token ~= ARGV[1] then return {0, 'taken'} end
if ARGV[8] ~= '' and rec.lane ~= ARGV[8] then return {0, 'wrong-lane'} end
if ARGV[9] ~= '' and (rec.task_id or '') ~= '' and rec.task_id ~= ARGV[9] then
  return {0, 'wrong-task'}
end
if rec.started_at then return {0, 'already-started'} end
local refusal, epoch = epoch_refusal(KEYS[3])
if refusal then return {0, refusal} end
if rec.epoch ~= epoch.gen then return {0, 'stale-epoch'} end
if ARGV[4] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[4] then
  redis.call('DEL', KEYS[1])
  return {0, 'stale-beat'}
end
rec.started_at = tonumber(ARGV[3])
rec.host = ARGV[5]
rec.pid = tonumber(ARGV[6])
rec.node = ARGV[7]
redis.call('SET', KEYS[1], cjson.encode(rec), 'PX', ARGV[2])
return {1, rec.fence}
